//! Continuable children in their narrow windows: cold resumes that race a token, a parent
//! replaced mid-resume, drains that meet an admitted creation or a queued follow-up, the final
//! flush before release, teardown failures on the terminal edge, and epochs that keep their own
//! output (CONT-14, 23, 24, 29, 39, 40, 44, 45, 47, 48, 52, 53, 55, 56, 57, 59, 60, 62).
//!
//! `support::Warnings` captures the warnings the runtime logs instead of failing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use subagents::testing::{Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentEvent, AgentEventKind, AgentRef, AgentScope, BlockType, CallId, CancelCause,
    CancellationToken, ContentBlock, ContinuableStart, ContinuableStartSpec, ErrorCode, EventKind,
    EventScope, FinishReason, FollowupOptions, InboxPolicy, MessageSource, ResumeAgent, Runtime,
    SessionEvent, SessionId, SetupDisposer, StopReason, StreamChunk, SubagentError, SubagentEvent,
    TokenUsage, TurnEndReason,
};

use crate::support::{
    delivered, ends_of, eventually, faulty, fixture, followup_child, held_forest, idle_after_turns,
    persisted, root, run_prompt, seam_runtime, settled, start_continuable, text, turn_ends, within,
    EventRecorder, SeamRecorder, Warnings,
};

/// How many model requests `session` made.
fn requests_of(model: &ScriptedModel, session: SessionId) -> usize {
    model
        .requests()
        .iter()
        .filter(|request| request.session_id == Some(session))
        .count()
}

/// Waits until `child` settled once; its `subagent/end`.
async fn settled_once(
    recorder: &SeamRecorder,
    child: SessionId,
) -> subagents::seam::SubagentRunEndInfo {
    settled(recorder, child, 1).await;
    ends_of(recorder, child).remove(0)
}

/// A resident child idle-waiting on its grandchild, which is held mid-turn at `grand_gate`;
/// everything the grandchild logged so far is already in the store.
async fn waiting_forest(
    rt: &Runtime,
    parent: &AgentRef,
    child_gate: &Gate,
    grand_gate: &Gate,
) -> (ContinuableStart, ContinuableStart) {
    let (started, child, grand) = held_forest(rt, parent, child_gate, grand_gate).await;
    child_gate.release();
    within("the child's turn", child.when_idle()).await;
    let grand_agent = rt.agents().get(grand.child_id).await.unwrap();
    grand_agent.log().drain().await.unwrap();
    (started, grand)
}

// CONT-14
#[actix_rt::test]
async fn a_forked_child_numbers_its_turns_after_the_inherited_prefix() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("parent turn"),
        ScriptStep::text("forked child"),
    ]);
    model.set_fallback(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    run_prompt(parent.agent(), "parent work").await;
    let started = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "fork",
            "child task",
            parent.agent(),
            text("child task"),
        ))
        .await
        .unwrap();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    let descriptor_at = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::Extension { event_type, .. } if event_type == "subagent/descriptor"))
        .expect("a descriptor");
    assert!(
        events[..descriptor_at]
            .iter()
            .any(|e| matches!(&e.kind, EventKind::TurnStart { turn: 1 })),
        "the seed carries the parent's completed turn"
    );
    let first_own_turn = events[descriptor_at..].iter().find_map(|e| match &e.kind {
        EventKind::TurnStart { turn } => Some(*turn),
        _ => None,
    });
    assert_eq!(
        first_own_turn,
        Some(2),
        "numbering continues after the inherited prefix and the descriptor"
    );
    let header = rt.store().unwrap().header(started.child_id).await.unwrap();
    assert!(header.seed_length.is_some_and(|length| length > 0));
}

// CONT-24
#[actix_rt::test]
async fn a_subagent_error_raised_while_resuming_reaches_the_caller_unwrapped() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    // From now on, materializing a child fails inside its setup (applied on cold resume too).
    let denied = SubagentError::new(ErrorCode::Unauthorized, "materialization denied");
    let refusal = denied.clone();
    let registration = rt.subagents().register_continuable_setup(Arc::new(
        move |_scope: &mut AgentScope| -> subagents::Result<SetupDisposer> { Err(refusal.clone()) },
    ));
    let error = followup_child(&rt, parent.agent(), started.child_id, "continue")
        .await
        .unwrap_err();
    assert_eq!(error, denied, "not re-wrapped as NOT_RESUMABLE");
    assert!(rt.agents().get(started.child_id).await.is_none());
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    // The failed materialization left nothing behind: the next delivery resumes the child.
    registration.remove().unwrap();
    followup_child(&rt, parent.agent(), started.child_id, "after the denial")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["task", "after the denial"]
    );
}

// CONT-52
#[actix_rt::test]
async fn an_epoch_keeps_its_earlier_text_past_a_final_usage_only_message() {
    let tool_call = |id: &str| ContentBlock::ToolCall {
        id: CallId::new(id),
        name: "noop".into(),
        arguments: "{}".into(),
    };
    let usage = |input_tokens: u64, output_tokens: u64| StreamChunk::Usage {
        usage: TokenUsage {
            input_tokens,
            output_tokens,
            ..TokenUsage::default()
        },
    };
    let call = |index: u32, id: &str| {
        vec![
            StreamChunk::BlockStart {
                index,
                block_type: BlockType::ToolCall,
            },
            StreamChunk::ToolCallDelta {
                index,
                id: id.into(),
                name: Some("noop".into()),
                arguments_delta: "{}".into(),
            },
            StreamChunk::BlockEnd {
                index,
                block: tool_call(id),
            },
        ]
    };
    // Step 1: text, then tool call t1.
    let mut first = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "partial one".into(),
        },
    ];
    first.extend(call(1, "t1"));
    first.extend([
        usage(10, 5),
        StreamChunk::Finish {
            reason: FinishReason::ToolCalls,
        },
    ]);
    // Step 2: tool-only and cut by the token limit: the call is dropped and an empty assistant
    // message is logged for its usage.
    let mut second = call(0, "t2");
    second.extend([
        usage(20, 5),
        StreamChunk::Finish {
            reason: FinishReason::MaxTokens,
        },
    ]);
    let model = ScriptedModel::with_script([ScriptStep::Chunks(first), ScriptStep::Chunks(second)]);
    model.set_fallback(ScriptStep::text("noted"));
    let (rt, parent, recorder) = fixture(&model).await;
    rt.tools()
        .register(subagents::Tool::new(
            "noop",
            "does nothing",
            json!({"type": "object"}),
            |_args, _ctx| Box::pin(async { Ok(subagents::ToolOutput::text("noop")) }),
        ))
        .unwrap();
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::MaxTokens);
    // The previous message whole (text and its call), not the tool result, not the empty one.
    assert_eq!(
        end.last_assistant_message,
        Some(vec![ContentBlock::text("partial one"), tool_call("t1")])
    );
}

// CONT-53
#[actix_rt::test]
async fn a_resumed_epoch_that_ran_no_step_reports_no_earlier_answer() {
    let model = ScriptedModel::with_script([ScriptStep::text("first answer")]);
    model.set_fallback(ScriptStep::text("ok"));
    let refusing = Arc::new(AtomicBool::new(false));
    let refuse = Arc::clone(&refusing);
    let (hook, parent_id) = crate::support::sparing_the_parent(move |_, decision| {
        if refuse.load(Ordering::SeqCst) {
            subagents::host::PreStepDecision::Reject
        } else {
            decision
        }
    });
    let rt = crate::support::seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .pre_step_hook(hook),
    )
    .await;
    let parent = root(&rt).await;
    *parent_id.lock().unwrap() = Some(parent.agent().id());
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        ends_of(&recorder, started.child_id)[0].last_assistant_message,
        Some(text("first answer"))
    );
    // Every later child step is refused: the resumed prompt is claimed, then discarded.
    refusing.store(true, Ordering::SeqCst);
    followup_child(&rt, parent.agent(), started.child_id, "again")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let end = &ends_of(&recorder, started.child_id)[1];
    assert_eq!(end.stop_reason, StopReason::Refusal);
    assert_eq!(
        end.last_assistant_message, None,
        "reading the whole session would resurrect the previous epoch's answer"
    );
}

// CONT-59 CONT-60
#[actix_rt::test]
async fn deliveries_discarded_inside_an_admission_window_release_the_activation() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("working").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    // An older accepted message, pending behind the running turn (CONT-60).
    followup_child(&rt, parent.agent(), started.child_id, "queued")
        .await
        .unwrap();
    // The next insertion's own observer cancels the child (user cause, inbox discarded), so
    // "doomed" is discarded inside the window that admitted it (CONT-59), and "queued" with it.
    let armed = Arc::new(AtomicBool::new(false));
    let (trigger, target) = (Arc::clone(&armed), child.clone());
    let _observer = rt.events().subscribe(
        EventScope::Key(started.child_id),
        move |event: &AgentEvent| {
            if matches!(event.kind, AgentEventKind::InboxInserted { .. })
                && trigger.swap(false, Ordering::SeqCst)
            {
                subagents::testing::cancel_as_runtime(
                    &target,
                    CancelCause::User,
                    InboxPolicy::Discard,
                );
            }
        },
    );
    armed.store(true, Ordering::SeqCst);
    followup_child(&rt, parent.agent(), started.child_id, "doomed")
        .await
        .expect("accepted, then discarded");
    gate.release();
    // A retained id would pin the Activation as running forever: settling on its own, with no
    // drain, is the assertion.
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["task"],
        "neither discarded message ran"
    );
}

// CONT-62
#[actix_rt::test]
async fn an_accepted_message_keeps_its_activation_until_it_runs() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([
        ScriptStep::text("first").gated(&gate),
        ScriptStep::text("second"),
    ]);
    model.set_fallback(ScriptStep::text("noted"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    let child_events = EventRecorder::new(&rt, started.child_id);
    let queued = followup_child(&rt, parent.agent(), started.child_id, "queued")
        .await
        .unwrap();
    assert_eq!(
        rt.agents().get(started.child_id).await.as_ref(),
        Some(&child),
        "the same Activation's agent"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 1);
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    // The accepted message was claimed by the same agent before it was ever disposed.
    let kinds = child_events.kinds();
    let claimed = kinds
        .iter()
        .position(
            |k| matches!(k, AgentEventKind::InboxClaimed { message, .. } if *message == queued),
        )
        .expect("the queued message was claimed");
    let disposed = kinds
        .iter()
        .position(|k| matches!(k, AgentEventKind::Disposed))
        .expect("the child was released");
    assert!(claimed < disposed, "{kinds:?}");
    assert_eq!(requests_of(&model, started.child_id), 2, "two child turns");
    assert_eq!(ends_of(&recorder, started.child_id).len(), 1, "one epoch");
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["child task", "queued"]
    );
}

// CONT-40
#[actix_rt::test]
async fn a_stale_scoped_root_leaves_its_live_same_id_agent_alone() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let (rt, first, recorder) = fixture(&model).await;
    let stale = first.agent().clone();
    first.dispose().await.unwrap();
    // The same session, live again as a new incarnation.
    let parent = rt
        .agents()
        .resume(ResumeAgent::new(stale.id()))
        .await
        .unwrap();
    assert_ne!(parent.agent(), &stale);
    let running = start_continuable(&rt, parent.agent(), "running").await;
    gate.reached().await;
    within(
        "the stale drain",
        rt.subagents().drain_continuable_descendants(&[stale]),
    )
    .await
    .unwrap();
    assert!(
        rt.agents().get(running.child_id).await.is_some(),
        "the live forest is untouched"
    );
    // Admission below the live same-id parent is still open.
    let later = start_continuable(&rt, parent.agent(), "later").await;
    gate.release();
    settled(&recorder, running.child_id, 1).await;
    settled(&recorder, later.child_id, 1).await;
    assert_eq!(
        ends_of(&recorder, running.child_id)[0].stop_reason,
        StopReason::Completed,
        "never cancelled"
    );
    assert_eq!(
        ends_of(&recorder, later.child_id)[0].stop_reason,
        StopReason::Completed
    );
}

// CONT-40: the other way round. A scoped drain of a root that was drained before, disposed
// and resumed closes admission below its live incarnation: the earlier incarnation's cutoff,
// which ended with it, does not stand in for the new one (found by the history checker, seed
// 6006033: a follow-up raced the second drain and cold-resumed a child under the drained root).
#[actix_rt::test]
async fn a_drain_of_a_resumed_root_closes_admission_below_it() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let first = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(first.agent().id()));
    let child = start_continuable(&rt, first.agent(), "task").await.child_id;
    settled(&recorder, child, 1).await;
    within(
        "the first drain",
        rt.subagents()
            .drain_continuable_descendants(&[first.agent().clone()]),
    )
    .await
    .unwrap();
    let id = first.agent().id();
    first.dispose().await.unwrap();
    let parent = rt.agents().resume(ResumeAgent::new(id)).await.unwrap();
    within(
        "the drain of the resumed root",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    let error = followup_child(&rt, parent.agent(), child, "after the drain")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Draining, "{error}");
    assert!(
        rt.agents().get(child).await.is_none(),
        "nothing below the drained root is live"
    );
}

// CONT-23
#[actix_rt::test]
async fn a_cold_inspection_is_abandoned_when_the_callers_token_fires() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, store, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    store.hold(StoreOperation::Inspect);
    let token = CancellationToken::new();
    let delivery = rt.subagents().followup(
        parent.agent(),
        started.child_id,
        text("cancel me"),
        FollowupOptions::new(MessageSource::User).cancel(token.clone()),
    );
    within("the cold inspection", store.held_calls(1)).await;
    token.cancel();
    let error = within("the follow-up", delivery).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    // The hold is never released: the follow-up returned because the inspection was dropped.
    eventually("the held inspection to be abandoned", || {
        store.abandoned_calls() == 1
    })
    .await;
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "nothing was resumed"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(!delivered(&persisted(&rt, started.child_id).await).contains(&"cancel me".to_owned()));
}

// CONT-29
#[actix_rt::test]
async fn a_failed_final_flush_is_logged_without_failing_the_activation() {
    let logged = Warnings::capture();
    let model = ScriptedModel::repeating(ScriptStep::text("answer"));
    let (rt, faults, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    faults.arm(StoreOperation::Flush);
    let started = start_continuable(&rt, parent.agent(), "task").await;
    let end = settled_once(&recorder, started.child_id).await;
    assert!(
        faults.flush_count() >= 1,
        "the settling child asked for a final flush"
    );
    assert_eq!(
        end.stop_reason,
        StopReason::Completed,
        "a best-effort flush never fails the epoch"
    );
    assert_eq!(end.last_assistant_message, Some(text("answer")));
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "released all the same"
    );
    let warnings = logged.text();
    assert!(
        warnings.contains("best-effort final session flush failed"),
        "{warnings}"
    );
    faults.disarm(StoreOperation::Flush);
    // The tail still reached the store.
    assert_eq!(delivered(&persisted(&rt, started.child_id).await), ["task"]);
}

// CONT-57
#[actix_rt::test]
async fn a_drain_cancels_the_running_turn_before_the_final_flush() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("slow").gated(&gate));
    let (rt, faults, parent) = faulty(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    // How many flushes had been asked for when the drain's cancel closed the child's turn.
    let at_turn_end = Arc::new(Mutex::new(None::<usize>));
    let (slot, counter) = (Arc::clone(&at_turn_end), Arc::clone(&faults));
    let _turn_ended = rt.events().subscribe(
        EventScope::Key(started.child_id),
        move |event: &AgentEvent| {
            if matches!(event.kind, AgentEventKind::TurnEnded { .. }) {
                let mut slot = slot.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(counter.flush_count());
                }
            }
        },
    );
    within("shutdown", rt.shutdown()).await.unwrap();
    let before = (*at_turn_end.lock().unwrap()).expect("the drain ended the child's turn");
    let after = faults.flush_count();
    assert!(
        after > before,
        "a final flush follows the cancelled turn's end ({before} before it, {after} in all)"
    );
    assert_eq!(
        turn_ends(&persisted(&rt, started.child_id).await),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }],
        "the flushed log covers what the cancellation added"
    );
}

// CONT-39
#[actix_rt::test]
async fn a_scoped_drain_waits_for_an_admitted_creation_and_rolls_it_back() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, _, parent) = faulty(&model).await;
    let parent_id = parent.agent().id();
    let created = Arc::new(Mutex::new(None::<SessionId>));
    let slot = Arc::clone(&created);
    let _created = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            if event.agent != parent_id && matches!(event.kind, AgentEventKind::Created) {
                *slot.lock().unwrap() = Some(event.agent);
            }
        });
    // The child's creation is admitted, then held before the child exists.
    let gate = Gate::new();
    crate::support::held_provider(&rt, &gate).await;
    let starting = tokio::spawn(rt.subagents().start_continuable(ContinuableStartSpec::new(
        "held",
        "t",
        parent.agent(),
        text("go"),
    )));
    within("the child's creation to hold", gate.reached()).await;
    let mut drain = Box::pin(
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    );
    // A later request is answered after the manager handled the drain; the yields let a drain
    // that did not wait resolve.
    subagents::testing::resident_count(rt.subagents()).await;
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    assert!(
        futures::poll!(drain.as_mut()).is_pending(),
        "the drain waits for the admitted materialization"
    );
    gate.release();
    let error = within("the start", starting).await.unwrap().unwrap_err();
    assert_eq!(error.code(), ErrorCode::Draining);
    within("the drain", drain).await.unwrap();
    let child = (*created.lock().unwrap()).expect("the child was published, then rolled back");
    assert!(rt.agents().get(child).await.is_none());
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent remains");
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    crate::support::assert_no_ghost(&rt, parent.agent(), child, ErrorCode::Draining).await;
    // Once the drained parent is gone and back, the refused child is not resumable either.
    let resumed_parent = {
        let id = parent.agent().id();
        parent.dispose().await.unwrap();
        rt.agents()
            .resume(subagents::ResumeAgent::new(id))
            .await
            .unwrap()
    };
    crate::support::assert_no_ghost(&rt, resumed_parent.agent(), child, ErrorCode::NotResumable)
        .await;
}

// CONT-44
#[actix_rt::test]
async fn a_drain_begun_at_agent_creation_resolves_after_the_rollback() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let parent_id = parent.agent().id();
    let order = Arc::new(Mutex::new(Vec::<&'static str>::new()));
    let drains = Arc::new(Mutex::new(Vec::<
        tokio::task::JoinHandle<subagents::Result<()>>,
    >::new()));
    let (seam, drain_parent) = (rt.subagents().clone(), parent.agent().clone());
    let (seen, pending) = (Arc::clone(&order), Arc::clone(&drains));
    let _lifecycle = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            if event.agent == parent_id {
                return;
            }
            match &event.kind {
                // After registry publication, before the Activation is installed.
                AgentEventKind::Created => {
                    // Requested now, inside the listener; awaited by the test.
                    let drain =
                        seam.drain_continuable_descendants(std::slice::from_ref(&drain_parent));
                    let seen = Arc::clone(&seen);
                    pending.lock().unwrap().push(tokio::spawn(async move {
                        let outcome = drain.await;
                        seen.lock().unwrap().push("drain");
                        outcome
                    }));
                }
                AgentEventKind::Disposed => seen.lock().unwrap().push("disposed"),
                _ => {}
            }
        });
    let error = crate::support::refused_start(&rt, parent.agent()).await;
    assert_eq!(error.code(), ErrorCode::Draining);
    let drains: Vec<_> = std::mem::take(&mut *drains.lock().unwrap());
    assert_eq!(drains.len(), 1, "the listener drained once");
    for drain in drains {
        within("the drain", drain).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["disposed", "drain"]);
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent remains");
}

// CONT-45
#[actix_rt::test]
async fn a_follow_up_admitted_before_a_drain_is_enqueued_before_the_cancel() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("working").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child_events = EventRecorder::new(&rt, started.child_id);
    let delivery = rt.subagents().followup(
        parent.agent(),
        started.child_id,
        text("before drain"),
        FollowupOptions::new(MessageSource::User),
    );
    // One scheduler pass (the TypeScript runtime's one tick): the follow-up's own task reaches the manager,
    // then the drain is requested. The gate stays closed: only the drain's cancel ends the turn.
    tokio::task::yield_now().await;
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[parent.agent().clone()]);
    let id = within("the follow-up", delivery)
        .await
        .expect("admitted before the drain closed admission");
    within("the drain", drain).await.unwrap();
    let kinds = child_events.kinds();
    let at = |wanted: &dyn Fn(&AgentEventKind) -> bool| kinds.iter().position(wanted);
    let enqueued =
        at(&|k| matches!(k, AgentEventKind::InboxInserted { message, .. } if *message == id))
            .expect("enqueued");
    let discarded =
        at(&|k| matches!(k, AgentEventKind::InboxDiscarded { message, .. } if *message == id))
            .expect("discarded by the drain's cancel");
    let turn_ended =
        at(&|k| matches!(k, AgentEventKind::TurnEnded { .. })).expect("the turn was cancelled");
    assert!(
        enqueued < discarded && discarded < turn_ended,
        "enqueue, then the cancel's discard, then the cancelled turn's end: {kinds:?}"
    );
    assert_eq!(
        requests_of(&model, started.child_id),
        1,
        "the admitted message never ran"
    );
}

// CONT-47
#[actix_rt::test]
async fn a_cold_resume_rechecks_the_exact_parent_after_loading() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, faults, original) = faulty(&model).await;
    let parent_id = original.agent().id();
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent_id));
    let started = start_continuable(&rt, original.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    idle_after_turns(original.agent(), 1).await;
    // Leave the stored child with an open turn: its resume then repairs the turn under the
    // lease and flushes the repair; holding that flush pauses the resume mid-way, after every
    // check made before loading.
    let stored = persisted(&rt, started.child_id).await;
    let next = u64::try_from(stored.len()).unwrap();
    let turn = stored
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::TurnStart { turn } => Some(*turn),
            _ => None,
        })
        .max()
        .unwrap()
        + 1;
    rt.store()
        .unwrap()
        .append(
            started.child_id,
            next,
            vec![Arc::new(SessionEvent::new(
                next,
                EventKind::TurnStart { turn },
            ))],
            None,
        )
        .await
        .unwrap();
    faults.hold(StoreOperation::Flush);
    let delivery = rt.subagents().followup(
        original.agent(),
        started.child_id,
        text("must not cross parent replacement"),
        FollowupOptions::new(MessageSource::User),
    );
    within("the resume to hold", faults.held_calls(1)).await;
    // The parent is replaced by a new incarnation of the same session while the resume waits.
    original.dispose().await.unwrap();
    let replacement = rt
        .agents()
        .resume(ResumeAgent::new(parent_id))
        .await
        .unwrap();
    assert_ne!(replacement.agent(), original.agent());
    faults.release(StoreOperation::Flush);
    let error = within("the follow-up", delivery).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unauthorized, "{error}");
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "the resumed child was rolled back"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(!delivered(&persisted(&rt, started.child_id).await)
        .contains(&"must not cross parent replacement".to_owned()));
    assert_eq!(
        ends_of(&recorder, started.child_id).len(),
        1,
        "no epoch was announced"
    );
    // The live replacement is the durable parent: it may continue the child.
    followup_child(
        &rt,
        replacement.agent(),
        started.child_id,
        "from the replacement",
    )
    .await
    .unwrap();
    settled(&recorder, started.child_id, 2).await;
}

// CONT-48
#[actix_rt::test]
async fn a_refused_submission_leaves_no_accepted_id_behind() {
    let (child_gate, grand_gate) = (Gate::new(), Gate::new());
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child works").gated(&child_gate));
    model.push(ScriptStep::text("grandchild works").gated(&grand_gate));
    let (rt, store, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let (started, child, _grand) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    child_gate.release();
    within("the child's turn", child.when_idle()).await;
    // Waiting on its grandchild, the child stays resident. Its next durable write fails, which
    // faults it: from then on its inbox refuses every submission.
    store.arm_for(StoreOperation::Append, started.child_id);
    followup_child(&rt, parent.agent(), started.child_id, "poke")
        .await
        .unwrap();
    within("the child to fault", async {
        while !child.status().await.unwrap().faulted {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let error = followup_child(&rt, parent.agent(), started.child_id, "throws")
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::AgentFaulted,
        "the inbox's own refusal: {error}"
    );
    // An id left in `accepted` would keep the child running forever. Once its grandchild
    // settles (whose notice the faulted child refuses as well) nothing else holds it.
    grand_gate.release();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
}

#[actix_rt::test]
async fn a_stale_parent_is_refused_before_a_cold_child_is_read() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, store, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    let stale = parent.agent().clone();
    parent.dispose().await.unwrap();
    // Any read of the cold child would wait here; the refusal must not get that far.
    store.hold(StoreOperation::Inspect);
    let error = within(
        "the refusal",
        followup_child(&rt, &stale, started.child_id, "from the grave"),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unauthorized);
    assert_eq!(store.abandoned_calls(), 0, "nothing was read");
    assert!(rt.agents().get(started.child_id).await.is_none());
}

#[actix_rt::test]
async fn a_child_that_faults_holding_accepted_work_still_settles() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let (rt, store, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    // Accepted behind the running turn; the child's next durable write fails and faults it,
    // so this follow-up can never be claimed.
    store.arm_for(StoreOperation::Append, started.child_id);
    followup_child(&rt, parent.agent(), started.child_id, "queued")
        .await
        .expect("accepted while the turn runs");
    let child = rt.agents().get(started.child_id).await.unwrap();
    // A faulted child settles and is released at once: a status refused because the agent is
    // gone comes after the fault too.
    within("the child to fault", async {
        while child.status().await.is_ok_and(|status| !status.faulted) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The unclaimable message no longer holds the Activation: the epoch ends, with the fault.
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        ends_of(&recorder, started.child_id)[0].stop_reason,
        StopReason::Error
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
}

// CONT-55
#[actix_rt::test]
async fn a_branch_that_fails_before_release_is_reported_on_the_terminal_edge() {
    let (child_gate, grand_gate) = (Gate::new(), Gate::new());
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child works").gated(&child_gate));
    model.push(ScriptStep::text("grandchild works").gated(&grand_gate));
    let (rt, store, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let (started, grand) = waiting_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    // The drain's cancel makes the grandchild log its turn's end; that write fails, so the
    // grandchild's release fails: a failure inside the child's teardown before the child's own
    // handle is disposed (which succeeds).
    store.arm_for(StoreOperation::Append, grand.child_id);
    let error = within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ActivationTeardownFailed);
    assert!(error.message().contains("child teardown failed"), "{error}");
    assert!(
        !error.message().contains("failed to dispose"),
        "the child's own release succeeded: {error}"
    );
    let end = settled_once(&recorder, started.child_id).await;
    assert_eq!(end.stop_reason, StopReason::Error);
    assert_eq!(end.last_assistant_message, None, "the outcome is withheld");
    assert!(rt.agents().get(started.child_id).await.is_none());
    assert!(rt.agents().get(grand.child_id).await.is_none());
}

// CONT-56
#[actix_rt::test]
async fn failures_before_and_at_release_are_reported_together() {
    let (child_gate, grand_gate) = (Gate::new(), Gate::new());
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child works").gated(&child_gate));
    model.push(ScriptStep::text("grandchild works").gated(&grand_gate));
    let (rt, store, parent) = faulty(&model).await;
    let (started, grand) = waiting_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    // Before release: the grandchild branch fails (as in CONT-55). At release: the child's own
    // handle fails to release its lease.
    store.arm_for(StoreOperation::Append, grand.child_id);
    store.arm_for(StoreOperation::ReleaseLease, started.child_id);
    let error = within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ActivationTeardownFailed);
    let message = error.to_string();
    assert!(message.contains("child teardown failed"), "{message}");
    assert!(
        message.contains("injected ReleaseLease failure"),
        "{message}"
    );
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "released anyway"
    );
}

// CONT-08 (adapted: the publication that can fail is the child's creation in the store)
// Lifecycle listeners are contained, so publishing `subagent/start` cannot fail; the durable
// publication that can is the child's creation in the store, written once its prompt was
// accepted and before the start answers.
#[actix_rt::test]
async fn a_child_whose_durable_creation_fails_is_rolled_back_and_never_answered() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, faults, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    faults.arm(StoreOperation::Create);
    let error = crate::support::refused_start(&rt, parent.agent()).await;
    assert_eq!(
        error.code(),
        ErrorCode::StoreIo,
        "the failed write surfaces: {error}"
    );
    within("the rollback", async {
        while rt.agents().list().await.len() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    // Installed before its prompt was accepted, it closes its lifecycle pair; its parent, who
    // never heard of it, gets no settled notice.
    recorder.wait_for_count(2).await;
    assert_eq!(recorder.names(), ["subagent/start", "subagent/end"]);
    assert!(crate::support::notices(parent.agent()).is_empty());
    assert!(
        rt.store()
            .unwrap()
            .list_children(parent.agent().id())
            .await
            .unwrap()
            .is_empty(),
        "nothing of it was stored"
    );
    faults.disarm(StoreOperation::Create);
    within(
        "the drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    within("shutdown", rt.shutdown()).await.unwrap();
}

// Beside CONT-08: a refusing `subagent/start` listener is contained and cannot roll a start
// back (not marked with the id: the test above ports it).
#[actix_rt::test]
async fn a_failing_start_listener_cannot_roll_a_start_back() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let _refusing = rt.subagents().events().subscribe(
        EventScope::Key(parent.agent().id()),
        |event: &SubagentEvent| -> Result<(), String> {
            match event {
                SubagentEvent::Start(_) => Err("start publication failed".to_owned()),
                _ => Ok(()),
            }
        },
    );
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(recorder.names(), ["subagent/start", "subagent/end"]);
    assert_eq!(
        ends_of(&recorder, started.child_id)[0].stop_reason,
        StopReason::Completed
    );
}

// A released child's last checkpoint is fenced by the lease it was written under: a disposal
// whose checkpoint write is overtaken by another runtime resuming the child (and checkpointing
// it) can never overwrite that newer row with its own older one.
#[actix_rt::test]
async fn a_late_disposal_checkpoint_never_overwrites_a_newer_holders_row() {
    use subagents::SessionPersistence;
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let inner = Arc::new(subagents::MemoryStore::new());
    let faults = Arc::new(subagents::testing::FaultInjectingStore::new(inner.clone()));
    let rt = crate::support::seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        faults.clone(),
    )
    .await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    faults.hold(StoreOperation::CachePut);
    let started = start_continuable(&rt, parent.agent(), "task").await;
    // The child settles; its release writes its log and frees the lease, then its checkpoint
    // waits at the store.
    within("a checkpoint write to be held", faults.held_calls(1)).await;
    let other = Runtime::builder()
        .shared_store(inner.clone())
        .model("scripted", model.clone())
        .build()
        .unwrap();
    let resumed = within("the other runtime's resume", async {
        loop {
            match other
                .agents()
                .resume(ResumeAgent::new(started.child_id))
                .await
            {
                Ok(resumed) => break resumed,
                Err(error) if error.code() == ErrorCode::SessionLeased => {
                    tokio::task::yield_now().await;
                }
                Err(error) => panic!("the released child resumes elsewhere: {error}"),
            }
        }
    })
    .await;
    run_prompt(resumed.agent(), "more").await;
    resumed.dispose().await.unwrap();
    let newer = inner
        .cache_get(subagents::projection::CHECKPOINT_RECORD, started.child_id)
        .await
        .unwrap()
        .expect("the newer holder checkpointed the child");
    faults.release(StoreOperation::CachePut);
    settled_once(&recorder, started.child_id).await;
    assert_eq!(
        inner
            .cache_get(subagents::projection::CHECKPOINT_RECORD, started.child_id)
            .await
            .unwrap(),
        Some(newer),
        "the late checkpoint was fenced out"
    );
}
