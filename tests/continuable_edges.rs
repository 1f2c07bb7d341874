//! Continuable children, part 2: settled notices at the edges (CONT-68..82), the public surface
//! (CONT-85), cancellation and registry collisions (CONT-87, CONT-89, CONT-93, CONT-103),
//! delegated policy on continuable children (CINH-03/04/07), and the lifecycle invariant
//! (INV-01..04).
//!
//! Tests marked "(adapted)" reach the TypeScript runtime's behavior through a different hold or fault
//! than it does; the comment above each says which.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use subagents::host::{DelegatedPolicy, DelegationPolicy};
use subagents::seam::{SubagentRunEndInfo, SubagentRunInfo};
use subagents::session::InboxTarget;
use subagents::testing::{Gate, ScriptStep, ScriptedModel, ScriptedProvider, StoreOperation};
use subagents::{
    AgentHandle, AgentRef, CancelCause, CancellationToken, ContentBlock, ContinuableStartSpec,
    CreateAgent, ErrorCode, EventKind, EventScope, FollowupOptions, ForkInProcess,
    InterruptAuthority, MemoryStore, Message, MessageSource, ReportDelivery, ReportOptions,
    ResumeAgent, RunId, Runtime, SessionEvent, SessionId, SpawnInProcess, StopReason,
    SubagentDescriptor, SubagentEvent, Subscription, TurnEndReason,
};

use crate::support::{
    delivered, ends_of, eventually, faulty, fixture, followup_child, grandchild, held_forest,
    idle_after_turns, persisted, root, run_prompt, seam_runtime_from, settled, start_continuable,
    start_run, text, turn_ends, within, SeamRecorder, Warnings,
};

const STOPPED: &str = "was stopped before it finished.";
const FAILED: &str = "failed before it finished.";

/// The content of the settled notice for `child`: the summary ending in `how`, then its
/// closing message or the statement that it left none.
fn notice_content(child: SessionId, how: &str, closing: Option<&str>) -> Vec<ContentBlock> {
    let mut content = vec![ContentBlock::text(format!(
        "Background subagent {child} {how}"
    ))];
    match closing {
        Some(closing) => {
            content.push(ContentBlock::text("Its closing message:"));
            content.push(ContentBlock::text(closing));
        }
        None => content.push(ContentBlock::text("It left no closing message.")),
    }
    content
}

/// Waits for `parent`'s first settled notice; its content.
async fn first_notice(parent: &AgentRef) -> Vec<ContentBlock> {
    eventually("the notice", || !notices_delivered(parent).is_empty()).await;
    notices_delivered(parent).remove(0).content
}

/// The settled notices journaled into `agent`'s inbox, read or still pending, in order (the
/// Rust form of the TypeScript runtime's `settlementNotices`: logged plus pending).
fn notices_delivered(agent: &AgentRef) -> Vec<Message> {
    agent
        .log()
        .events()
        .into_iter()
        .flat_map(|event| match event.kind {
            EventKind::InboxSpliced { inserted, .. } => inserted,
            _ => Vec::new(),
        })
        .filter(|message| matches!(message.source, MessageSource::SubagentSettledNotice { .. }))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Settled notices
// ---------------------------------------------------------------------------------------------

// CONT-68
#[actix_rt::test]
async fn a_turn_that_failed_before_its_first_step_is_reported_failed_with_the_last_answer() {
    let first = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("the answer").gated(&first));
    // A deployment participant that cannot decide the child's later turns.
    let (failing, parent_id) = crate::support::sparing_the_parent(|step, decision| {
        if step.turn >= 2 {
            subagents::host::PreStepDecision::Fail("the policy service is unreachable".into())
        } else {
            decision
        }
    });
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .pre_step_hook(failing),
    )
    .await;
    let parent = root(&rt).await;
    *parent_id.lock().unwrap() = Some(parent.agent().id());
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    first.reached().await;
    // Queued behind turn 1, so turn 2 opens on it the moment turn 1 ends.
    followup_child(&rt, parent.agent(), started.child_id, "second task")
        .await
        .unwrap();
    first.release();
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Error);
    assert_eq!(end.last_assistant_message, Some(text("the answer")));
    assert_eq!(
        first_notice(parent.agent()).await,
        notice_content(started.child_id, FAILED, Some("the answer"))
    );
    let events = persisted(&rt, started.child_id).await;
    assert!(
        !delivered(&events).contains(&"second task".to_owned()),
        "the second task never reached the model"
    );
    assert!(matches!(
        &turn_ends(&events)[..],
        [TurnEndReason::Completed, TurnEndReason::Error { error }]
            if error.message == "the policy service is unreachable"
    ));
}

// Beside CONT-68: a later turn that fails at its model call is reported the same way.
#[actix_rt::test]
async fn a_turn_that_failed_after_an_answered_one_is_reported_failed_with_that_answer() {
    let first = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("the answer").gated(&first));
    model.push(ScriptStep::fail(
        "UPSTREAM_DOWN",
        "the model is unavailable",
    ));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    first.reached().await;
    // Queued behind turn 1, so turn 2 opens on it the moment turn 1 ends.
    followup_child(&rt, parent.agent(), started.child_id, "second task")
        .await
        .unwrap();
    first.release();
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Error, "not `completed`");
    assert_eq!(end.last_assistant_message, Some(text("the answer")));
    assert_eq!(
        first_notice(parent.agent()).await,
        notice_content(started.child_id, FAILED, Some("the answer"))
    );
    let events = persisted(&rt, started.child_id).await;
    assert!(matches!(
        turn_ends(&events)[..],
        [TurnEndReason::Completed, TurnEndReason::Error { .. }]
    ));
}

// CONT-69 (adapted: turn 2 is held at its model call, not at a pre-step boundary)
#[actix_rt::test]
async fn work_cut_short_by_a_manager_drain_is_reported_stopped_with_the_last_answer() {
    let first = Gate::new();
    let second = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("the answer").gated(&first));
    model.push(ScriptStep::text("never streamed").gated(&second));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    first.reached().await;
    followup_child(&rt, parent.agent(), started.child_id, "second task")
        .await
        .unwrap();
    first.release();
    second.reached().await;
    // The manager-wide drain (the gate is never released: the drain's cancel ends the hold).
    within("shutdown", rt.shutdown()).await.unwrap();
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(
        end.stop_reason,
        StopReason::Aborted,
        "turn 1's clean end must not answer for the cut turn"
    );
    assert_eq!(end.last_assistant_message, Some(text("the answer")));
    let notices: Vec<Vec<ContentBlock>> = notices_delivered(parent.agent())
        .into_iter()
        .map(|message| message.content)
        .collect();
    assert_eq!(
        notices,
        [notice_content(
            started.child_id,
            STOPPED,
            Some("the answer")
        )]
    );
    assert_eq!(
        turn_ends(&persisted(&rt, started.child_id).await),
        [
            TurnEndReason::Completed,
            TurnEndReason::Aborted {
                reason: CancelCause::Parent
            }
        ]
    );
}

// CONT-70 (adapted: held at its first model call, before anything streamed)
#[actix_rt::test]
async fn a_child_drained_before_it_answered_is_reported_stopped_without_a_closing_message() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("never streamed").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    within("shutdown", rt.shutdown()).await.unwrap();
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Aborted);
    assert_eq!(end.last_assistant_message, None);
    let notices: Vec<Vec<ContentBlock>> = notices_delivered(parent.agent())
        .into_iter()
        .map(|message| message.content)
        .collect();
    assert_eq!(notices, [notice_content(started.child_id, STOPPED, None)]);
}

// CONT-71 (adapted: held at its first model call)
#[actix_rt::test]
async fn a_child_an_ancestor_interrupted_before_it_answered_settles_as_stopped() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("never streamed").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::Ancestor(parent.agent().clone()),
        )
        .await
        .unwrap();
    // Nothing is left to run and nothing below it: it settles on its own.
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Aborted);
    assert_eq!(end.last_assistant_message, None);
    assert_eq!(
        first_notice(parent.agent()).await,
        notice_content(started.child_id, STOPPED, None)
    );
    assert_eq!(
        turn_ends(&persisted(&rt, started.child_id).await),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
}

// CONT-72 (adapted: the accepted work no turn opens over is a quiet report, not maintenance)
// The host has no maintenance phase that defers a waking send; an idle child takes a quiet
// report into its next step without opening a turn.
#[actix_rt::test]
async fn accepted_work_cancelled_before_any_turn_opened_is_reported_stopped() {
    let child_gate = Gate::new();
    let grand_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("the answer").gated(&child_gate));
    model.push(ScriptStep::text("grandchild").gated(&grand_gate));
    let (rt, parent, recorder) = fixture(&model).await;
    // The held grandchild keeps the child resident once its own turn closes.
    let (started, child, grand) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    child_gate.release();
    idle_after_turns(&child, 1).await;
    let grand_agent = rt.agents().get(grand.child_id).await.unwrap();
    rt.subagents()
        .report_from(
            &grand_agent,
            text("never runs"),
            ReportOptions::new(ReportDelivery::Quiet),
        )
        .await
        .unwrap();
    assert_eq!(child.log().last_turn(), 1, "the report opened no turn");
    within("shutdown", rt.shutdown()).await.unwrap();

    // Turn 1 closed cleanly and no later turn opened: the cancelled queue is the only record
    // that this epoch was cut short.
    let log = persisted(&rt, started.child_id).await;
    assert_eq!(turn_ends(&log), [TurnEndReason::Completed]);
    assert!(
        !delivered(&log)
            .iter()
            .any(|text| text.contains("never runs")),
        "the report was never delivered to the model"
    );
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Aborted);
    assert_eq!(end.last_assistant_message, Some(text("the answer")));
    assert_eq!(
        notices_delivered(parent.agent())
            .into_iter()
            .map(|message| message.content)
            .collect::<Vec<_>>(),
        [notice_content(
            started.child_id,
            STOPPED,
            Some("the answer")
        )]
    );
}

// CONT-77 (black-box: the notice wakes the waiting parent, which reads it before it settles)
#[actix_rt::test]
async fn a_waiting_parent_reads_its_childs_notice_before_it_may_settle() {
    let middle_gate = Gate::new();
    let inner_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("outer").gated(&middle_gate));
    model.push(ScriptStep::text("inner").gated(&inner_gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let all = SeamRecorder::new(&rt, EventScope::All);
    let outer = start_continuable(&rt, parent.agent(), "child task").await;
    middle_gate.reached().await;
    let middle = rt.agents().get(outer.child_id).await.unwrap();
    let inner = grandchild(&rt, &middle).await;
    inner_gate.reached().await;
    middle_gate.release();
    within("the middle's first turn", middle.when_idle()).await;
    assert!(
        rt.agents().get(outer.child_id).await.is_some(),
        "the middle waits for its child"
    );
    inner_gate.release();
    settled(&recorder, outer.child_id, 1).await;
    let ends: Vec<SessionId> = all
        .events()
        .into_iter()
        .filter_map(|event| match event {
            SubagentEvent::End(end) => Some(end.info.id),
            _ => None,
        })
        .collect();
    assert_eq!(ends, [inner.child_id, outer.child_id]);
    let events = persisted(&rt, outer.child_id).await;
    // Delivered as a waking next-turn send (a settling middle would only have been injected
    // into its next step, and then discarded by its own teardown unread).
    let (target, notice) = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::InboxSpliced {
                target, inserted, ..
            } => inserted
                .iter()
                .find(|m| {
                    matches!(m.source, MessageSource::SubagentSettledNotice { sender_session_id, .. } if sender_session_id == inner.child_id)
                })
                .map(|m| (*target, m.id)),
            _ => None,
        })
        .expect("the inner child's notice reached the middle");
    assert!(matches!(target, InboxTarget::NextTurn));
    assert!(
        events
            .iter()
            .any(|event| matches!(&event.kind, EventKind::UserMessage(m) if m.id == notice)),
        "the middle read the notice in a turn before it settled"
    );
    let end = &ends_of(&recorder, outer.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Completed);
    assert_eq!(
        end.last_assistant_message,
        Some(text("ok")),
        "its last answer is the turn that read the notice"
    );
}

// CONT-79
#[actix_rt::test]
async fn a_scoped_drain_records_a_stopped_notice_without_waking_the_parent() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("never streamed").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    within(
        "the scoped drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    assert_eq!(
        ends_of(&recorder, started.child_id)[0].stop_reason,
        StopReason::Aborted
    );
    eventually("the notice", || {
        !notices_delivered(parent.agent()).is_empty()
    })
    .await;
    parent.agent().when_idle().await;
    let notices = notices_delivered(parent.agent());
    assert_eq!(notices.len(), 1);
    assert_eq!(
        notices[0].content,
        notice_content(started.child_id, STOPPED, None)
    );
    assert!(
        !parent
            .agent()
            .log()
            .events()
            .iter()
            .any(|event| matches!(event.kind, EventKind::TurnStart { .. })),
        "no parent turn"
    );
    let status = parent.agent().status().await.unwrap();
    assert_eq!(status.turn, None);
    assert_eq!(
        (status.next_step, status.next_turn),
        (1, 0),
        "the notice waits as context"
    );
}

// CONT-80
#[actix_rt::test]
async fn a_teardown_notice_is_journaled_then_cancelled_unread_when_the_parent_is_disposed() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("never streamed").gated(&gate));
    let (rt, parent, _) = fixture(&model).await;
    let parent_id = parent.agent().id();
    start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    within(
        "the scoped drain",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .unwrap();
    eventually("the notice", || {
        !notices_delivered(parent.agent()).is_empty()
    })
    .await;
    assert_eq!(parent.agent().status().await.unwrap().next_step, 1);
    // Disposal discards pending work: the notice is durably cancelled, never read.
    parent.dispose().await.unwrap();
    let resumed = rt
        .agents()
        .resume(ResumeAgent::new(parent_id))
        .await
        .unwrap();
    let status = resumed.agent().status().await.unwrap();
    assert_eq!(
        (status.next_step, status.next_turn),
        (0, 0),
        "a resumed parent has nothing pending"
    );
    resumed.dispose().await.unwrap();
    let splices: Vec<(usize, u64)> = persisted(&rt, parent_id)
        .await
        .into_iter()
        .filter_map(|event| match event.kind {
            EventKind::InboxSpliced {
                inserted,
                removed_count,
                ..
            } => Some((inserted.len(), removed_count.unwrap_or(0))),
            _ => None,
        })
        .collect();
    assert_eq!(
        splices,
        [(1, 0), (0, 1)],
        "delivered, then cancelled unread"
    );
}

// CONT-82 (the parent refuses the notice because it is faulted, instead of a spied followup)
#[actix_rt::test]
async fn a_refused_notice_is_logged_and_the_child_still_settles_cleanly() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("the answer").gated(&gate));
    let (rt, faults, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let warnings = Warnings::capture();
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    // Everything the held child wrote is durable, so only the parent's next write fails.
    child.log().flush().await.unwrap();
    faults.arm(StoreOperation::Append);
    parent
        .agent()
        .inject(text("poke"), MessageSource::User)
        .await
        .unwrap();
    within("the parent to fault", async {
        while !parent.agent().status().await.unwrap().faulted {
            tokio::task::yield_now().await;
        }
    })
    .await;
    faults.disarm(StoreOperation::Append);
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Completed);
    assert_eq!(end.last_assistant_message, Some(text("the answer")));
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "released"
    );
    eventually("the warning", || {
        warnings
            .text()
            .contains("settled notice could not be delivered")
    })
    .await;
    assert!(
        notices_delivered(parent.agent()).is_empty(),
        "the faulted parent journaled nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// Public surface, cancellation, collisions, interrupts
// ---------------------------------------------------------------------------------------------

// CONT-85 (the tool half; the method half is a property of the `Subagents` type, see the notes)
#[actix_rt::test]
async fn the_seam_registers_no_report_or_steering_tool() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    idle_after_turns(parent.agent(), 1).await;
    let requests = model.requests();
    assert!(requests
        .iter()
        .any(|r| r.session_id == Some(started.child_id)));
    assert!(requests
        .iter()
        .any(|r| r.session_id == Some(parent.agent().id())));
    for request in &requests {
        let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert!(
            !names.contains(&"report") && !names.contains(&"steer_subagent"),
            "{names:?}"
        );
    }
}

// CONT-87
#[actix_rt::test]
async fn a_cold_follow_up_cancelled_before_acceptance_delivers_nothing() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    let aborted = CancellationToken::new();
    aborted.cancel();
    let error = rt
        .subagents()
        .followup(
            parent.agent(),
            started.child_id,
            text("aborted"),
            FollowupOptions::new(MessageSource::User).cancel(aborted),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "not resumed"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(delivered(&events), ["child task"]);
    let starts = recorder
        .events()
        .iter()
        .filter(|event| matches!(event, SubagentEvent::Start(info) if info.id == started.child_id))
        .count();
    assert_eq!(starts, 1, "no second epoch");
}

// CONT-89 (adapted: an unmanaged live agent stands in for a child whose Activation record was lost)
#[actix_rt::test]
async fn a_cold_resume_never_adopts_a_live_agent_of_the_same_id() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    // Delegated by the parent and carrying a continuable descriptor, but never an Activation.
    let unmanaged = rt
        .agents()
        .create(
            CreateAgent::new()
                .delegated_by(parent.agent().id(), 1)
                .setup(
                    |_: &mut subagents::AgentScope, log: &subagents::SessionLog| {
                        log.append(SubagentDescriptor::continuable("spawn", "orphan").event())?;
                        Ok(None)
                    },
                ),
        )
        .await
        .unwrap();
    let id = unmanaged.agent().id();
    unmanaged.agent().log().flush().await.unwrap();
    let error = followup_child(&rt, parent.agent(), id, "hello")
        .await
        .unwrap_err();
    // design-notes §9.7 maps a registry collision to NOT_RESUMABLE; this runtime passes the
    // registry's own SubagentError through.
    assert_eq!(error.code(), ErrorCode::DuplicateAgent, "{error}");
    assert_eq!(
        rt.agents().get(id).await.as_ref(),
        Some(unmanaged.agent()),
        "the live agent is untouched"
    );
    let inserted_anything = unmanaged.agent().log().events().iter().any(|event| {
        matches!(&event.kind, EventKind::InboxSpliced { inserted, .. } if !inserted.is_empty())
    });
    assert!(!inserted_anything, "nothing was delivered to it");
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(recorder.events().is_empty(), "no epoch was opened");
    unmanaged.dispose().await.unwrap();
}

// CONT-93 (adapted: the would-be parent settles while the grandchild's creation is held)
#[actix_rt::test]
async fn a_child_published_under_a_parent_that_settled_meanwhile_is_rolled_back() {
    let middle_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("middle").gated(&middle_gate));
    let (rt, _, parent) = faulty(&model).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let outer = start_continuable(&rt, parent.agent(), "child task").await;
    middle_gate.reached().await;
    let middle = rt.agents().get(outer.child_id).await.unwrap();
    let below_middle = SeamRecorder::new(&rt, EventScope::Key(middle.id()));
    // Admitted while the middle runs; its creation then waits before the child exists.
    let creation = Gate::new();
    crate::support::held_provider(&rt, &creation).await;
    let starting = rt.subagents().start_continuable(ContinuableStartSpec::new(
        "held",
        "grandchild task",
        &middle,
        text("grandchild task"),
    ));
    within("the grandchild's creation to be held", creation.reached()).await;
    // The middle owns nothing yet, so it settles and is released meanwhile.
    middle_gate.release();
    settled(&recorder, outer.child_id, 1).await;
    creation.release();
    let error = within("the start", starting).await.unwrap_err();
    // The TypeScript runtime reaches ACTIVATION_CLOSING (ownership refused by a disposing parent); here the
    // parent's release completed first, so the exact-live-parent check refuses it.
    assert_eq!(error.code(), ErrorCode::Unauthorized, "{error}");
    let live: Vec<SessionId> = rt.agents().list().await.iter().map(AgentRef::id).collect();
    assert_eq!(live, [parent.agent().id()], "no leftover agent");
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(
        below_middle.events().is_empty(),
        "the rolled-back child never emitted a lifecycle edge"
    );
}

// CONT-103
#[actix_rt::test]
async fn an_interrupt_after_a_drain_opened_the_disposal_signals_nothing_more() {
    let child_gate = Gate::new();
    let grand_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child").gated(&child_gate));
    model.push(ScriptStep::text("grandchild").gated(&grand_gate));
    let (rt, faults, parent) = faulty(&model).await;
    let (started, child, _) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    // The grandchild's release waits at the store, so the child's teardown (which waits for
    // its grandchild first) keeps the child's agent alive to be inspected.
    faults.hold(StoreOperation::ReleaseLease);
    // Queued first: the drain opens both disposals (one discard-cancel each) before the
    // manager handles the interrupt.
    let drain = rt
        .subagents()
        .drain_continuable_descendants(&[parent.agent().clone()]);
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .expect("an interrupt that lost the race with disposal is an accepted no-op");
    within("the grandchild's release to be held", faults.held_calls(1)).await;
    within("the child's cancelled turn", child.when_idle()).await;
    let status = child
        .status()
        .await
        .expect("the child waits for its grandchild's teardown");
    // The interrupt's cancel keeps the inbox, which parks it; the drain's discards it. A
    // second signal would show here.
    assert!(!status.parked, "the interrupt signalled the child again");
    assert_eq!(
        turn_ends(&child.log().events()),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
    faults.release(StoreOperation::ReleaseLease);
    within("the drain", drain).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Delegated policy on continuable children
// ---------------------------------------------------------------------------------------------

/// A deployment with an approval service, whose parent sandbox override is `sandbox`.
struct PinnedPolicy {
    sandbox: Option<String>,
}

impl DelegationPolicy for PinnedPolicy {
    fn capture(&self, _parent: SessionId) -> DelegatedPolicy {
        DelegatedPolicy {
            sandbox_mode: self.sandbox.clone(),
            approval_pinned: true,
        }
    }
}

async fn policy_runtime(sandbox: Option<&str>) -> Runtime {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    seam_runtime_from(
        Runtime::builder()
            .model("scripted", model)
            .delegation_policy(PinnedPolicy {
                sandbox: sandbox.map(str::to_owned),
            }),
    )
    .await
}

/// The `sandbox/mode` and `approval/policy` events of a log, with their seqs.
fn policy_events(events: &[SessionEvent]) -> Vec<(u64, String, Value)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Extension { event_type, data }
                if event_type == "sandbox/mode" || event_type == "approval/policy" =>
            {
                Some((e.seq, event_type.to_string(), data.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Starts a continuable `fork` child of `parent` and waits for it to settle; its persisted log
/// and header seed length.
async fn forked_and_settled(rt: &Runtime, parent: &AgentHandle) -> (Vec<SessionEvent>, u64) {
    let recorder = SeamRecorder::new(rt, EventScope::Key(parent.agent().id()));
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
    let header = rt.store().unwrap().header(started.child_id).await.unwrap();
    let seed_length = header
        .seed_length
        .expect("a fork child of a parent with a completed turn has a seed");
    (persisted(rt, started.child_id).await, seed_length)
}

// CINH-03
#[actix_rt::test]
async fn an_unswitched_sandbox_leaves_a_continuable_child_only_the_approval_pin() {
    let rt = policy_runtime(None).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    let policy: Vec<(String, Value)> = policy_events(&events)
        .into_iter()
        .map(|(_, kind, data)| (kind, data))
        .collect();
    assert_eq!(
        policy,
        [(
            "approval/policy".to_owned(),
            json!({"policy": "never", "source": "delegation"})
        )],
        "no sandbox/mode: the child stays on the deployment default"
    );
    let context = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::UserMessage(m) if matches!(m.source, MessageSource::Plugin { .. }) => {
                Some(m.text())
            }
            _ => None,
        })
        .expect("a runtime-context message");
    assert!(
        context.contains("Approval prompts are disabled"),
        "{context}"
    );
    assert!(!context.contains("Current DSH file policy"), "{context}");
}

// CINH-04
#[actix_rt::test]
async fn an_unswitched_fork_child_pins_approval_after_its_seed() {
    let rt = policy_runtime(None).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "parent work").await;
    let (events, seed_length) = forked_and_settled(&rt, &parent).await;
    assert!(seed_length > 0);
    let policy = policy_events(&events);
    assert_eq!(policy.len(), 1, "{policy:?}");
    let (seq, kind, data) = &policy[0];
    assert_eq!(kind, "approval/policy");
    assert_eq!(data, &json!({"policy": "never", "source": "delegation"}));
    assert!(
        *seq > seed_length,
        "after the fork prefix and its end marker"
    );
}

// CINH-07
#[actix_rt::test]
async fn a_fork_childs_delegated_sandbox_follows_the_stale_seeded_mode() {
    let rt = policy_runtime(Some("read-only")).await;
    // The parent's log records an older mode inside the completed turns a fork replays.
    let parent = rt
        .agents()
        .create(CreateAgent::new().setup(
            |_: &mut subagents::AgentScope, log: &subagents::SessionLog| {
                log.append(EventKind::Extension {
                    event_type: "sandbox/mode".into(),
                    data: json!({"mode": "workspace-write", "source": "user"}),
                })?;
                Ok(None)
            },
        ))
        .await
        .unwrap();
    run_prompt(parent.agent(), "parent work").await;
    let (events, seed_length) = forked_and_settled(&rt, &parent).await;
    let modes: Vec<(u64, Value)> = policy_events(&events)
        .into_iter()
        .filter(|(_, kind, _)| kind == "sandbox/mode")
        .map(|(seq, _, data)| (seq, data))
        .collect();
    assert_eq!(
        modes
            .iter()
            .map(|(_, data)| data.clone())
            .collect::<Vec<_>>(),
        [
            json!({"mode": "workspace-write", "source": "user"}),
            json!({"mode": "read-only", "source": "delegation"}),
        ]
    );
    assert!(
        modes[0].0 < seed_length,
        "the stale mode is part of the seed"
    );
    assert!(modes[1].0 > seed_length, "the delegated mode follows it");
}

use subagents::seam::LifecycleInvariant;

/// The checker installed on a runtime's seam events; violations are collected, not thrown
/// (the event bus contains its listeners).
struct LifecycleWatch {
    checker: Arc<Mutex<LifecycleInvariant>>,
    violations: Arc<Mutex<Vec<String>>>,
    _subscription: Subscription,
}

impl LifecycleWatch {
    async fn install(rt: &Runtime) -> Self {
        let checker = Arc::new(Mutex::new(LifecycleInvariant::with_providers(
            rt.subagents().list().await,
        )));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let (check, sink) = (Arc::clone(&checker), Arc::clone(&violations));
        let subscription =
            rt.subagents()
                .events()
                .subscribe(EventScope::All, move |event: &SubagentEvent| {
                    if let Err(violation) = check.lock().unwrap().check(event) {
                        sink.lock().unwrap().push(violation.message().to_owned());
                    }
                });
        Self {
            checker,
            violations,
            _subscription: subscription,
        }
    }

    fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }

    fn open_runs(&self) -> usize {
        self.checker.lock().unwrap().open_runs()
    }
}

fn run_info(provider: &str) -> SubagentRunInfo {
    SubagentRunInfo {
        run_id: RunId::new(),
        provider: provider.to_owned(),
        id: SessionId::new(),
        local: false,
        parent: SessionId::new(),
    }
}

fn end_of(info: &SubagentRunInfo) -> SubagentEvent {
    SubagentEvent::End(SubagentRunEndInfo {
        info: info.clone(),
        stop_reason: StopReason::Completed,
        last_assistant_message: None,
    })
}

const NIL: &str = "00000000-0000-0000-0000-000000000000";

// INV-01
#[test]
fn provider_and_run_lifecycle_pairs_are_accepted() {
    let mut invariant = LifecycleInvariant::default();
    let run = run_info("mock");
    for event in [
        SubagentEvent::ProviderAdded("mock".into()),
        SubagentEvent::Start(run.clone()),
        end_of(&run),
        SubagentEvent::ProviderRemoved("mock".into()),
    ] {
        assert_eq!(invariant.check(&event), Ok(()), "{event:?}");
    }
    assert_eq!(invariant.open_runs(), 0);
}

// INV-01 (what this runtime really emits: one-shot runs, epochs, removals)
#[actix_rt::test]
async fn every_lifecycle_edge_the_runtime_emits_pairs_up() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .model("scripted", model)
        .build()
        .unwrap();
    let watch = LifecycleWatch::install(&rt).await;
    let all = SeamRecorder::new(&rt, EventScope::All);
    let spawn = rt
        .subagents()
        .register_provider(SpawnInProcess::default())
        .await
        .unwrap();
    let fork = rt
        .subagents()
        .register_provider(ForkInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let run = start_run(&rt, "fork", parent.agent(), "once").await;
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    followup_child(&rt, parent.agent(), started.child_id, "again")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    all.wait_until("every end", |events| {
        events
            .iter()
            .filter(|e| matches!(e, SubagentEvent::End(_)))
            .count()
            >= 3
    })
    .await;
    fork.remove();
    spawn.remove();
    // Answered after both removals, in mailbox order.
    assert!(rt.subagents().list().await.is_empty());
    let violations = watch.violations();
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(watch.open_runs(), 0);
    let names = all.names();
    for (name, count) in [
        ("subagent/provider-added", 2),
        ("subagent/start", 3),
        ("subagent/end", 3),
        ("subagent/provider-removed", 2),
    ] {
        assert_eq!(
            names.iter().filter(|n| **n == name).count(),
            count,
            "{names:?}"
        );
    }
}

// INV-02
#[test]
fn malformed_provider_transitions_are_rejected() {
    let mut invariant = LifecycleInvariant::default();
    assert!(invariant
        .check(&SubagentEvent::ProviderAdded(String::new()))
        .unwrap_err()
        .message()
        .contains("names must be non-empty"));
    invariant
        .check(&SubagentEvent::ProviderAdded("mock".into()))
        .unwrap();
    assert!(invariant
        .check(&SubagentEvent::ProviderAdded("mock".into()))
        .unwrap_err()
        .message()
        .contains("repeated \"mock\""));
    assert!(invariant
        .check(&SubagentEvent::ProviderRemoved("missing".into()))
        .unwrap_err()
        .message()
        .contains("unknown provider"));
}

// INV-02 (the registry never emits a malformed provider transition)
#[actix_rt::test]
async fn the_registry_emits_only_well_formed_provider_transitions() {
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .build()
        .unwrap();
    let watch = LifecycleWatch::install(&rt).await;
    let all = SeamRecorder::new(&rt, EventScope::All);
    assert!(rt
        .subagents()
        .register_provider(ScriptedProvider::new(""))
        .await
        .is_err());
    let mock = rt
        .subagents()
        .register_provider(ScriptedProvider::new("mock"))
        .await
        .unwrap();
    let duplicate = rt
        .subagents()
        .register_provider(ScriptedProvider::new("mock"))
        .await
        .unwrap_err();
    assert_eq!(duplicate.code(), ErrorCode::DuplicateProvider);
    mock.remove();
    assert!(rt.subagents().list().await.is_empty());
    let violations = watch.violations();
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(
        all.names(),
        ["subagent/provider-added", "subagent/provider-removed"]
    );
}

// INV-03
#[test]
fn malformed_and_unpaired_run_transitions_are_rejected() {
    let mut invariant = LifecycleInvariant::default();
    let empty = "provider, runId, and child id must be non-empty";
    let mut no_provider = run_info("mock");
    no_provider.provider = String::new();
    assert!(invariant
        .check(&SubagentEvent::Start(no_provider))
        .unwrap_err()
        .message()
        .contains(empty));
    let mut nil_run = run_info("mock");
    nil_run.run_id = NIL.parse().unwrap();
    assert!(invariant
        .check(&SubagentEvent::Start(nil_run))
        .unwrap_err()
        .message()
        .contains(empty));
    let run = run_info("mock");
    invariant.check(&SubagentEvent::Start(run.clone())).unwrap();
    assert!(invariant
        .check(&SubagentEvent::Start(run.clone()))
        .unwrap_err()
        .message()
        .contains("repeated run id"));
    let mut unknown = run.clone();
    unknown.run_id = RunId::new();
    assert!(invariant
        .check(&end_of(&unknown))
        .unwrap_err()
        .message()
        .contains("no matching subagent/start"));
    let mut other_child = run.clone();
    other_child.id = SessionId::new();
    assert!(invariant
        .check(&end_of(&other_child))
        .unwrap_err()
        .message()
        .contains("identity diverges"));
    // The rejected events changed nothing: the real end still closes the run.
    invariant.check(&end_of(&run)).unwrap();
    assert_eq!(invariant.open_runs(), 0);
}

// INV-04
#[test]
fn a_run_may_name_a_provider_whose_registration_ended() {
    let mut invariant = LifecycleInvariant::default();
    invariant
        .check(&SubagentEvent::ProviderAdded("historical".into()))
        .unwrap();
    invariant
        .check(&SubagentEvent::ProviderRemoved("historical".into()))
        .unwrap();
    let run = run_info("historical");
    assert_eq!(invariant.check(&SubagentEvent::Start(run.clone())), Ok(()));
    assert_eq!(invariant.check(&end_of(&run)), Ok(()));
}

// INV-04 (a cold resume after the provider unregistered still pairs up)
#[actix_rt::test]
async fn a_cold_resume_after_its_provider_left_keeps_the_invariant() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = Runtime::builder()
        .store(MemoryStore::new())
        .model("scripted", model)
        .build()
        .unwrap();
    let watch = LifecycleWatch::install(&rt).await;
    let spawn = rt
        .subagents()
        .register_provider(SpawnInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    spawn.remove();
    assert!(rt.subagents().list().await.is_empty());
    followup_child(&rt, parent.agent(), started.child_id, "after removal")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let violations = watch.violations();
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(watch.open_runs(), 0);
}
