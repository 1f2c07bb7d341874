//! Continuable children at the edges: teardown failures, drains racing starts and deliveries,
//! notices to a parent whose lineage is tearing down, setup contributions, delegated policy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use subagents::host::{DelegatedPolicy, DelegationPolicy};
use subagents::testing::{Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentEvent, AgentEventKind, AgentRef, CancellationToken, ContentBlock, ContinuableStartSpec,
    ErrorCode, EventKind, EventScope, MessageSource, Runtime, SessionId, SetupDisposer, StopReason,
    SubagentEvent, SubagentStartRequest,
};

use crate::support::{
    ends_of, eventually, faulty, followup_child, notices, persisted, released, root, seam_runtime,
    seam_runtime_from, seam_runtime_on, settled, start_continuable, start_under, text, within,
    SeamRecorder, CHILD_ROUTE,
};

/// Waits until `child` settled once; its `subagent/end`.
async fn settled_once(
    recorder: &SeamRecorder,
    child: SessionId,
) -> subagents::seam::SubagentRunEndInfo {
    settled(recorder, child, 1).await;
    ends_of(recorder, child).remove(0)
}

/// Whether an inbox insertion of a settled notice was journaled in `agent`'s log.
fn notice_inserted(agent: &AgentRef) -> bool {
    agent.log().events().iter().any(|event| {
        matches!(&event.kind, EventKind::InboxSpliced { inserted, .. }
            if inserted.iter().any(|message| matches!(message.source, MessageSource::SubagentSettledNotice { .. })))
    })
}

/// A runtime on a fault-injecting store, its root, and a continuable child of the root whose
/// first turn is held at `gate` (later turns answer "ok").
async fn held_child(
    gate: &Gate,
) -> (
    Runtime,
    Arc<subagents::testing::FaultInjectingStore>,
    subagents::AgentHandle,
    SessionId,
) {
    held_at(gate, ScriptStep::text("held").gated(gate)).await
}

/// [`held_child`] with the child's first step `held`, which must hold at `gate`.
async fn held_at(
    gate: &Gate,
    held: ScriptStep,
) -> (
    Runtime,
    Arc<subagents::testing::FaultInjectingStore>,
    subagents::AgentHandle,
    SessionId,
) {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(held);
    let (rt, faults, parent) = faulty(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    (rt, faults, parent, started.child_id)
}

// CONT-30 CONT-54 CONT-73
#[actix_rt::test]
async fn a_child_whose_release_fails_settles_as_error_and_withholds_its_output() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("noted"));
    model.push(ScriptStep::text("the answer").gated(&gate));
    let (rt, faults, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    faults.arm(StoreOperation::ReleaseLease);
    gate.release();
    let end = settled_once(&recorder, started.child_id).await;
    assert_eq!(end.stop_reason, StopReason::Error);
    assert_eq!(end.last_assistant_message, None, "the outcome is withheld");
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "released anyway"
    );
    faults.disarm(StoreOperation::ReleaseLease);
    eventually("the notice", || !notices(parent.agent()).is_empty()).await;
    let notice = &notices(parent.agent())[0];
    assert!(notice.contains("failed before it finished."), "{notice}");
    assert!(notice.contains("It left no closing message."), "{notice}");
}

// CONT-92 CONT-41
#[actix_rt::test]
async fn a_drain_reports_a_failing_branch_after_every_branch_settled() {
    let gate = Gate::new();
    let (rt, faults, parent, child) = held_child(&gate).await;
    faults.arm(StoreOperation::ReleaseLease);
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[parent.agent().clone()]);
    gate.release();
    let error = within("the drain", drain).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::ActivationTeardownFailed);
    assert!(rt.agents().get(child).await.is_none());
    faults.disarm(StoreOperation::ReleaseLease);
}

// A drain cancels a child's running turn on its way to the release, and the release writes the
// child's projection checkpoint: the cancelled turn writes none beside it, so a drain holds one
// checkpoint per releasing child, not two.
#[actix_rt::test]
async fn a_drained_child_writes_each_checkpoint_unit_once_at_its_release() {
    let gate = Gate::new();
    let (rt, faults, parent, child) = held_child(&gate).await;
    drain_writes_each_unit_once(&rt, &faults, &parent, child).await;
}

// The same when the cancelled step had streamed enough to be due a throttled checkpoint at its
// end (hundreds of chunks): the step's end writes none, the release writes each unit once.
#[actix_rt::test]
async fn a_drained_child_due_a_checkpoint_mid_turn_still_writes_each_unit_once() {
    let gate = Gate::new();
    let mut head = vec![subagents::StreamChunk::BlockStart {
        index: 0,
        block_type: subagents::BlockType::Text,
    }];
    head.extend((0..300).map(|_| subagents::StreamChunk::TextDelta {
        index: 0,
        text: "x".into(),
    }));
    let held = ScriptStep::Split {
        head,
        gate: gate.clone(),
        tail: Vec::new(),
    };
    let (rt, faults, parent, child) = held_at(&gate, held).await;
    drain_writes_each_unit_once(&rt, &faults, &parent, child).await;
}

/// Drains `parent`'s children and asserts `child` had each checkpoint unit written once.
async fn drain_writes_each_unit_once(
    rt: &Runtime,
    faults: &subagents::testing::FaultInjectingStore,
    parent: &subagents::AgentHandle,
    child: SessionId,
) {
    within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .expect("the drain succeeds");
    let units = faults.cache_puts(child);
    assert!(!units.is_empty(), "the release checkpoints the child");
    let distinct: std::collections::HashSet<&String> = units.iter().collect();
    assert_eq!(
        distinct.len(),
        units.len(),
        "each unit written once: {units:?}"
    );
}

// CONT-43 CONT-83
#[actix_rt::test]
async fn a_drain_begun_at_start_publication_rolls_the_start_back_silently() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let drained = Arc::new(Mutex::new(None));
    let subagents = rt.subagents().clone();
    let drain_parent = parent.agent().clone();
    let slot = Arc::clone(&drained);
    let _listener = rt.subagents().events().subscribe(
        EventScope::Key(parent.agent().id()),
        move |event: &SubagentEvent| {
            if matches!(event, SubagentEvent::Start(_)) {
                // Requested now, inside the listener; awaited by the test.
                let drain =
                    subagents.drain_continuable_descendants(std::slice::from_ref(&drain_parent));
                *slot.lock().unwrap() = Some(tokio::spawn(drain));
            }
        },
    );
    let inserted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&inserted);
    let parent_id = parent.agent().id();
    let _inbox = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            if event.agent != parent_id
                && matches!(event.kind, AgentEventKind::InboxInserted { .. })
            {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
    let error = crate::support::refused_start(&rt, parent.agent()).await;
    assert_eq!(error.code(), ErrorCode::Draining);
    let drain = drained
        .lock()
        .unwrap()
        .take()
        .expect("the listener drained");
    within("the drain", drain).await.unwrap().unwrap();
    assert_eq!(
        inserted.load(Ordering::SeqCst),
        0,
        "no inbox insertion was ever observed"
    );
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent remains");
    assert!(
        notices(parent.agent()).is_empty() && !notice_inserted(parent.agent()),
        "no notice for a child the caller never saw"
    );
    // Its lifecycle pair still closes.
    recorder.wait_for_count(2).await;
    assert_eq!(recorder.names(), ["subagent/start", "subagent/end"]);
}

// CONT-07
#[actix_rt::test]
async fn a_token_fired_at_start_publication_rolls_the_child_back() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let token = CancellationToken::new();
    let fire = token.clone();
    let _listener = rt.subagents().events().subscribe(
        EventScope::Key(parent.agent().id()),
        move |event: &SubagentEvent| {
            if matches!(event, SubagentEvent::Start(_)) {
                fire.cancel();
            }
        },
    );
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    let error = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go")).cancel(token),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    within("the rollback", async {
        while rt.agents().list().await.len() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    // No ghost: the child the start created and rolled back was never stored, so nothing
    // lists it and nothing resumes it.
    recorder.wait_for_count(2).await;
    let ghost = match &recorder.events()[0] {
        SubagentEvent::Start(info) => info.id,
        other => panic!("a start first: {other:?}"),
    };
    crate::support::assert_no_ghost(&rt, parent.agent(), ghost, ErrorCode::NotResumable).await;
}

// CONT-58 CONT-46 CONT-79
#[actix_rt::test]
async fn a_drain_discards_accepted_work_and_records_the_notice_without_a_wake() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    followup_child(&rt, parent.agent(), started.child_id, "queued")
        .await
        .unwrap();
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[parent.agent().clone()]);
    gate.release();
    within("the drain", drain).await.unwrap();
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    let events = persisted(&rt, started.child_id).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::UserMessage(m) if m.text() == "queued")),
        "accepted but never run: no automatic replay"
    );
    eventually("the notice", || notice_inserted(parent.agent())).await;
    parent.agent().when_idle().await;
    assert_eq!(
        parent.agent().log().last_turn(),
        0,
        "a tearing-down lineage is not woken"
    );
    let snapshot = parent.agent().status().await.unwrap();
    assert_eq!(snapshot.next_step, 1, "the notice waits as context");
}

// CONT-75
#[actix_rt::test]
async fn notices_to_a_busy_parent_join_its_running_turn() {
    let parent_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    // Hold the parent inside a turn (the gated step is the next request: its own), then let
    // both children run and settle meanwhile.
    model.push(ScriptStep::text("parent busy").gated(&parent_gate));
    parent
        .agent()
        .followup(text("work"), MessageSource::User)
        .await
        .unwrap();
    parent_gate.reached().await;
    let first = start_continuable(&rt, parent.agent(), "one").await;
    let second = start_continuable(&rt, parent.agent(), "two").await;
    settled_once(&recorder, first.child_id).await;
    settled_once(&recorder, second.child_id).await;
    within("both notices pending", async {
        loop {
            if parent.agent().status().await.unwrap().next_step == 2 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    parent_gate.release();
    within("the parent's turn", parent.agent().when_idle()).await;
    assert_eq!(parent.agent().log().last_turn(), 1, "no new parent turn");
    assert_eq!(notices(parent.agent()).len(), 2, "both consumed");
}

// CONT-25
#[actix_rt::test]
async fn a_follow_up_racing_settlement_is_delivered() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    for _ in 0..10 {
        let started = start_continuable(&rt, parent.agent(), "task").await;
        let child = rt.agents().get(started.child_id).await;
        if let Some(child) = child {
            child.when_idle().await;
        }
        // Sent the moment the child went idle: it races the settlement decision.
        followup_child(&rt, parent.agent(), started.child_id, "late")
            .await
            .expect("a delivery that loses the race cold-resumes");
        within("the late message to be logged", async {
            loop {
                let events = persisted(&rt, started.child_id).await;
                let logged = events
                    .iter()
                    .any(|e| matches!(&e.kind, EventKind::UserMessage(m) if m.text() == "late"));
                if logged && rt.agents().get(started.child_id).await.is_none() {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
}

/// Starts a one-shot `spawn` child of `parent` and waits for its answer: the child stays live
/// until its run is disposed.
async fn answered_one_shot(
    rt: &Runtime,
    parent: &AgentRef,
    prompt: &str,
) -> (subagents::SubagentRun, AgentRef) {
    let run = rt
        .subagents()
        .start("spawn", SubagentStartRequest::new(parent, text(prompt)))
        .await
        .unwrap();
    let child = run.local_agent().cloned().unwrap();
    run.result().await.unwrap();
    (run, child)
}

/// Starts a continuable child of `parent`, its first turn held at `gate` of `model`, and waits
/// until the turn is held.
async fn held_below(
    rt: &Runtime,
    (model, gate): (&ScriptedModel, &Gate),
    parent: &AgentRef,
) -> SessionId {
    model.push(ScriptStep::text("held").gated(gate));
    let started = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "below",
            parent,
            text("go"),
        ))
        .await
        .unwrap();
    gate.reached().await;
    started.child_id
}

// CONT-38
#[actix_rt::test]
async fn a_scoped_drain_finds_descendants_below_a_departed_one_shot_child() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let (run, intermediate) = answered_one_shot(&rt, parent.agent(), "intermediate").await;
    let descendant = held_below(&rt, (&model, &gate), &intermediate).await;
    run.dispose().await.unwrap();
    assert!(rt.agents().get(intermediate.id()).await.is_none());
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[parent.agent().clone()]);
    gate.release();
    within("the drain", drain).await.unwrap();
    assert!(rt.agents().get(descendant).await.is_none());
}

// CONT-38, two intermediates deep: a continuable child below two live one-shot children is
// still below the drained root. Before, its lineage stopped at the first intermediate that was
// not resident (the second one-shot child's parent), so the drain neither disposed it nor
// refused what came below it.
#[actix_rt::test]
async fn a_scoped_drain_finds_descendants_below_two_live_one_shot_children() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let mut runs = Vec::new();
    let mut above = parent.agent().clone();
    for prompt in ["outer intermediate", "inner intermediate"] {
        let (run, intermediate) = answered_one_shot(&rt, &above, prompt).await;
        above = intermediate;
        runs.push(run);
    }
    let descendant = held_below(&rt, (&model, &gate), &above).await;
    within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    assert!(
        rt.agents().get(descendant).await.is_none(),
        "the descendant was disposed by the drain"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    // The cutoff holds below the intermediates too.
    let refused = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "late",
            &above,
            text("go"),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Draining, "{refused}");
    for run in runs.into_iter().rev() {
        run.dispose().await.unwrap();
    }
}

// SETUP facade (seed-differences row 6)
#[actix_rt::test]
async fn a_setup_contribution_reaches_later_children_and_removal_revokes_it() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let installed = Arc::new(AtomicUsize::new(0));
    let released = Arc::new(AtomicUsize::new(0));
    let (i, r) = (Arc::clone(&installed), Arc::clone(&released));
    let registration = rt.subagents().register_continuable_setup(Arc::new(
        move |_scope: &mut subagents::AgentScope| {
            i.fetch_add(1, Ordering::SeqCst);
            let r = Arc::clone(&r);
            Ok(Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }) as SetupDisposer)
        },
    ));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    assert_eq!(installed.load(Ordering::SeqCst), 1);
    registration.remove().unwrap();
    assert_eq!(
        released.load(Ordering::SeqCst),
        1,
        "revoked from the resident child at once"
    );
    gate.release();
    settled_once(&recorder, started.child_id).await;
    assert_eq!(released.load(Ordering::SeqCst), 1, "released exactly once");
    let later = start_continuable(&rt, parent.agent(), "again").await;
    settled_once(&recorder, later.child_id).await;
    assert_eq!(
        installed.load(Ordering::SeqCst),
        1,
        "a removed contribution is not installed"
    );
}

/// A deployment whose sandbox override can be switched.
#[derive(Clone, Default)]
struct SwitchablePolicy {
    sandbox: Arc<Mutex<Option<String>>>,
}

impl DelegationPolicy for SwitchablePolicy {
    fn capture(&self, _parent: SessionId) -> DelegatedPolicy {
        DelegatedPolicy {
            sandbox_mode: self.sandbox.lock().unwrap().clone(),
            approval_pinned: true,
        }
    }
}

fn policy_events(events: &[subagents::SessionEvent]) -> Vec<(String, serde_json::Value)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Extension { event_type, data } if event_type != "subagent/descriptor" => {
                Some((event_type.to_string(), data.clone()))
            }
            _ => None,
        })
        .collect()
}

// CINH-01 CINH-02 CINH-06
#[actix_rt::test]
async fn a_continuable_child_records_the_policy_captured_at_delegation_once() {
    let policy = SwitchablePolicy {
        sandbox: Arc::new(Mutex::new(Some("read-only".into()))),
    };
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .delegation_policy(policy.clone()),
    )
    .await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let start = rt.subagents().start_continuable(ContinuableStartSpec::new(
        "spawn",
        "t",
        parent.agent(),
        text("go"),
    ));
    // Switched right after the call: the child keeps what was captured.
    *policy.sandbox.lock().unwrap() = Some("danger-full-access".into());
    let started = start.await.unwrap();
    settled_once(&recorder, started.child_id).await;
    let expected = vec![
        (
            "sandbox/mode".to_owned(),
            json!({"mode": "read-only", "source": "delegation"}),
        ),
        (
            "approval/policy".to_owned(),
            json!({"policy": "never", "source": "delegation"}),
        ),
    ];
    assert_eq!(
        policy_events(&persisted(&rt, started.child_id).await),
        expected
    );
    followup_child(&rt, parent.agent(), started.child_id, "more")
        .await
        .unwrap();
    recorder
        .wait_until("the second epoch", |events| {
            events
                .iter()
                .filter(|e| matches!(e, SubagentEvent::End(end) if end.info.id == started.child_id))
                .count()
                >= 2
        })
        .await;
    assert_eq!(
        policy_events(&persisted(&rt, started.child_id).await),
        expected,
        "a cold resume never re-captures the parent"
    );
    let first_request = model
        .requests()
        .into_iter()
        .find(|request| request.session_id == Some(started.child_id))
        .unwrap();
    let context: Vec<ContentBlock> = first_request
        .messages
        .iter()
        .flat_map(|message| message.content.clone())
        .collect();
    assert!(context
        .iter()
        .any(|block| matches!(block, ContentBlock::Text { text } if text.contains("You are a delegated subagent"))));
    // The resumed epoch states the recorded policy again: a context without the sandbox line
    // would tell the child it is unrestricted.
    let contexts = runtime_contexts(&persisted(&rt, started.child_id).await);
    assert!(
        contexts
            .iter()
            .all(|context| context.contains("Current DSH file policy: read-only.")),
        "{contexts:?}"
    );
}

// A resumed child whose policy did not change states its runtime context once in its whole
// log: the snapshot its model history still holds counts as sent (upstream's runtime-context
// projection restores it from the log, and adds one only when the text changed). Before, every
// cold resume appended the same text again, and the model saw it once per epoch.
#[actix_rt::test]
async fn an_unchanged_runtime_context_enters_a_resumed_childs_log_once() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime_from(Runtime::builder().model("scripted", model.clone())).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "go").await;
    settled_once(&recorder, started.child_id).await;
    for (epochs, text) in [(2, "more"), (3, "again")] {
        followup_child(&rt, parent.agent(), started.child_id, text)
            .await
            .unwrap();
        settled(&recorder, started.child_id, epochs).await;
    }
    let contexts = runtime_contexts(&persisted(&rt, started.child_id).await);
    assert_eq!(contexts.len(), 1, "{contexts:?}");
    assert!(contexts[0].contains("You are a delegated subagent"));
    let requests: Vec<_> = model
        .requests()
        .into_iter()
        .filter(|request| request.session_id == Some(started.child_id))
        .collect();
    assert_eq!(requests.len(), 3, "one model call an epoch");
    for request in requests {
        let stated = request
            .messages
            .iter()
            .filter(|message| message.text().contains("You are a delegated subagent"))
            .count();
        assert_eq!(stated, 1, "every epoch's model call sees the context once");
    }
}

/// The runtime-context messages that entered a log, in order.
fn runtime_contexts(events: &[subagents::SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage(message)
                if matches!(message.source, MessageSource::Plugin { .. }) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect()
}

// CINH-05 (adapted: a deployment pre-step hook records the switch, as a sandbox service would)
// The switch is a `sandbox/mode` event with a `user` source in the child's own log.
#[actix_rt::test]
async fn a_later_child_side_switch_wins_over_the_delegation_snapshot() {
    let policy = SwitchablePolicy {
        sandbox: Arc::new(Mutex::new(Some("read-only".into()))),
    };
    // The child switches its own sandbox as its first turn begins, after the delegation
    // snapshot was recorded.
    let (switch, parent_id) = crate::support::sparing_the_parent(|step, decision| {
        if step.turn == 1 && step.step == 1 {
            step.log
                .append(EventKind::Extension {
                    event_type: "sandbox/mode".into(),
                    data: json!({"mode": "workspace-write", "source": "user"}),
                })
                .expect("the switch is recorded");
        }
        decision
    });
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .delegation_policy(policy.clone())
            .pre_step_hook(switch),
    )
    .await;
    let parent = root(&rt).await;
    *parent_id.lock().unwrap() = Some(parent.agent().id());
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "go").await;
    settled_once(&recorder, started.child_id).await;
    // The parent widens meanwhile: a resume never re-captures it.
    *policy.sandbox.lock().unwrap() = Some("danger-full-access".into());
    followup_child(&rt, parent.agent(), started.child_id, "more")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let log = persisted(&rt, started.child_id).await;
    let modes: Vec<serde_json::Value> = log
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Extension { event_type, data } if event_type == "sandbox/mode" => {
                Some(data.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        modes,
        [
            json!({"mode": "read-only", "source": "delegation"}),
            json!({"mode": "workspace-write", "source": "user"}),
        ]
    );
    let contexts = runtime_contexts(&log);
    assert!(contexts[0].contains("Current DSH file policy: read-only."));
    let resumed = contexts.last().unwrap();
    assert!(
        resumed.contains("Current DSH file policy: workspace-write."),
        "the resumed child states its own switch: {resumed}"
    );
    assert!(
        resumed.contains("Approval prompts are disabled"),
        "the approval pin still holds"
    );
}

// A host-owned parent with continuable children has an ownership node, started with its first
// resident child and stopped with its last; the node carries out the parent's scoped drain
// (child first), and a continuable parent needs none (its Activation owns its children).
#[actix_rt::test]
async fn a_host_owned_parent_has_an_ownership_node_while_it_has_children() {
    let (first, second) = (Gate::new(), Gate::new());
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("one").gated(&first));
    let rt = seam_runtime(&model).await;
    let nodes = || subagents::testing::owner_node_count(rt.subagents());
    let (left, right) = (root(&rt).await, root(&rt).await);
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    assert_eq!(nodes().await, 0);
    let held = start_continuable(&rt, left.agent(), "one").await;
    first.reached().await;
    let grand =
        crate::support::grandchild(&rt, &rt.agents().get(held.child_id).await.unwrap()).await;
    // The grandchild answers and settles; the next request is the right parent's child's.
    settled(&recorder, grand.child_id, 1).await;
    model.push(ScriptStep::text("two").gated(&second));
    let other = start_continuable(&rt, right.agent(), "two").await;
    second.reached().await;
    assert_eq!(
        nodes().await,
        2,
        "one node per host-owned parent, none for the continuable parent"
    );
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[left.agent().clone()]);
    first.release();
    within("the left parent's drain", drain).await.unwrap();
    settled(&recorder, grand.child_id, 1).await;
    settled(&recorder, held.child_id, 1).await;
    assert_eq!(nodes().await, 1, "the drained parent's node stopped");
    second.release();
    settled(&recorder, other.child_id, 1).await;
    assert_eq!(nodes().await, 0, "no parent has a resident child");
}

// An Activation starts beside its child on the runtime's workers, so its teardown runs on the
// child's thread: every epoch still settles with its answer and its parent's notice, absent
// children cold-resume, and a drain releases children held mid-turn on either thread.
#[actix_rt::test]
async fn continuable_children_on_two_workers_settle_resume_and_drain() {
    on_two_workers(Arc::new(subagents::MemoryStore::new())).await;
}

// The same on sled, whose writes from the two workers go through the store's write thread:
// a store opened again afterwards holds every epoch of every child.
#[actix_rt::test]
async fn continuable_children_on_two_workers_on_sled_settle_resume_drain_and_read_back() {
    let dir = tempfile::tempdir().expect("a directory");
    let store = subagents::SledStore::open(dir.path()).expect("sled opens");
    let children = on_two_workers(Arc::new(store)).await;
    // Opened off this thread: what the runtime dropped is released on it.
    let path = dir.path().to_path_buf();
    let reopened = tokio::task::spawn_blocking(move || subagents::SledStore::open(path))
        .await
        .expect("the reopening ran")
        .expect("the runtime let go of its store");
    for child in children {
        let log = subagents::SessionPersistence::read_stored(&reopened, child, 0, u64::MAX)
            .await
            .expect("the child's log reads back");
        let turns = log
            .iter()
            .filter(|event| matches!(event.kind, EventKind::TurnEnd { .. }))
            .count();
        assert_eq!(turns, 3, "{child}'s three epochs are stored");
    }
}

/// Continuable children of one parent on a runtime of two workers over `store`: each settles,
/// is resumed cold, is held mid-turn and drained; answers the children.
async fn on_two_workers(store: Arc<dyn subagents::SessionPersistence>) -> Vec<SessionId> {
    const CHILDREN: usize = 24;
    let child_model = ScriptedModel::repeating(ScriptStep::text("child ok"));
    let rt = seam_runtime_on(
        Runtime::builder()
            .model(
                "scripted",
                ScriptedModel::repeating(ScriptStep::text("noted")),
            )
            .model(CHILD_ROUTE, child_model.clone())
            .workers(2),
        store,
    )
    .await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let mut children = Vec::with_capacity(CHILDREN);
    for index in 0..CHILDREN {
        children.push(start_under(&rt, parent.agent(), &format!("child {index}"), "task").await);
    }
    for &child in &children {
        settled(&recorder, child, 1).await;
        released(&rt, child).await;
        followup_child(&rt, parent.agent(), child, "more")
            .await
            .expect("the absent child is resumed");
    }
    for &child in &children {
        settled(&recorder, child, 2).await;
        let ends = ends_of(&recorder, child);
        assert!(
            ends.iter()
                .all(|end| end.stop_reason == StopReason::Completed
                    && end.last_assistant_message == Some(text("child ok"))),
            "both epochs of {child} answered"
        );
    }
    eventually("every epoch's notice in the parent's log", || {
        notices(parent.agent()).len() == 2 * CHILDREN
    })
    .await;

    // A third epoch of every child, each held at its model call, then drained.
    let gates: Vec<Gate> = (0..CHILDREN).map(|_| Gate::new()).collect();
    child_model.push_all(
        gates
            .iter()
            .map(|gate| ScriptStep::text("held").gated(gate)),
    );
    for &child in &children {
        released(&rt, child).await;
        followup_child(&rt, parent.agent(), child, "again")
            .await
            .expect("the absent child is resumed");
    }
    for gate in &gates {
        gate.reached().await;
    }
    assert_eq!(
        subagents::testing::resident_count(rt.subagents()).await,
        CHILDREN
    );
    within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .expect("every held child is released");
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent is live");
    for &child in &children {
        settled(&recorder, child, 3).await;
        let turns = persisted(&rt, child)
            .await
            .iter()
            .filter(|event| matches!(event.kind, EventKind::TurnEnd { .. }))
            .count();
        assert_eq!(turns, 3, "{child}'s drained turn is closed in its log");
    }
    rt.shutdown().await.expect("the workers stop");
    children
}
