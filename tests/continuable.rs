//! Continuable children: start, follow-up (enqueue, wake, cold resume), interrupt, reports,
//! settled notices, epochs and drains, through the public seam.

use std::sync::Arc;

use serde_json::json;
use subagents::testing::{
    FaultInjectingStore, Gate, ScriptStep, ScriptedModel, ScriptedProvider, StoreOperation,
};
use subagents::{
    CancelCause, CancellationToken, ChildAgentOptions, ContentBlock, ContinuableStartSpec,
    ErrorCode, EventKind, EventScope, FollowupOptions, InterruptAuthority, MessageSource,
    ReportDelivery, ReportOptions, Runtime, SessionId, StopReason, SubagentEvent,
    SubagentStartRequest, ToolFilter, TurnEndReason,
};

use crate::support::{
    delivered, ends_of, eventually, fixture, followup_child, held_forest, idle_after_turns,
    notices, persisted, root, seam_runtime, settled, start_continuable, text, turn_ends, within,
    SeamRecorder,
};

/// The last model request `session` made.
fn last_request_of(model: &ScriptedModel, session: SessionId) -> subagents::GenerateRequest {
    model
        .requests()
        .into_iter()
        .rev()
        .find(|request| request.session_id == Some(session))
        .expect("the session made a request")
}

fn descriptors(events: &[subagents::SessionEvent]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Extension { event_type, data } if event_type == "subagent/descriptor" => {
                Some(data.clone())
            }
            _ => None,
        })
        .collect()
}

// CONT-01 CONT-05
#[actix_rt::test]
async fn a_start_answers_both_ids_at_acceptance_and_records_the_descriptor_first() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child answer").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    assert_ne!(started.child_id, parent.agent().id());
    let child = within("the child", rt.agents().get(started.child_id))
        .await
        .expect("the child is live");
    gate.reached().await;
    // The turn holding at the gate claimed the prompt: the accepted id is the prompt's.
    assert!(child.log().events().iter().any(|event| {
        matches!(&event.kind, EventKind::UserMessage(message) if message.id == started.message_id)
    }));
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(delivered(&events), ["child task"]);
    let descriptor_at = events
        .iter()
        .position(|e| matches!(&e.kind, EventKind::Extension { event_type, .. } if event_type == "subagent/descriptor"))
        .expect("a descriptor");
    let first_turn = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::TurnStart { .. }))
        .expect("a turn");
    assert!(
        descriptor_at < first_turn,
        "the descriptor precedes the first turn"
    );
    assert_eq!(
        descriptors(&events),
        [json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "child task"})]
    );
    let header = rt.store().unwrap().header(started.child_id).await.unwrap();
    assert_eq!(header.parent_session, Some(parent.agent().id()));
    assert_eq!(
        header.origin,
        Some(subagents::session::SessionOrigin::Subagent)
    );
    assert_eq!(header.delegation_depth, Some(1));
}

// CONT-03
#[actix_rt::test]
async fn a_provider_without_prepare_continuable_is_refused_before_anything_exists() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, _) = fixture(&model).await;
    let provider = ScriptedProvider::new("oneshot-only");
    rt.subagents()
        .register_provider(provider.clone())
        .await
        .unwrap()
        .keep();
    let error = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "oneshot-only",
            "task",
            parent.agent(),
            text("go"),
        ))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    assert!(error
        .message()
        .contains("does not support continuable children"));
    assert_eq!(provider.start_count(), 0);
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent exists");
}

// CONT-04 SVC-07 (adapted: the runtime always binds its manager; persistence is the service a
// runtime can lack)
#[actix_rt::test]
async fn a_runtime_without_persistence_refuses_continuable_children() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = Runtime::builder()
        .model("scripted", model.clone())
        .build()
        .unwrap();
    rt.subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap()
        .keep();
    let parent = root(&rt).await;
    let error = crate::support::refused_start(&rt, parent.agent()).await;
    assert_eq!(error.code(), ErrorCode::PersistenceUnavailable);
    // A follow-up cannot cold-resume without a store either, and nothing was left behind.
    let error = followup_child(&rt, parent.agent(), SessionId::new(), "more")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::PersistenceUnavailable);
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent is live");
}

// SVC-05 SVC-06 (adapted: the manager is always bound; its teardown is not public, and with
// nothing continuable bound a drain and an interrupt are accepted no-ops)
#[actix_rt::test]
async fn with_nothing_continuable_a_drain_and_an_interrupt_are_accepted_no_ops() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    within(
        "a drain with no children",
        rt.subagents()
            .drain_continuable_descendants(&[parent.agent().clone()]),
    )
    .await
    .expect("a drain of nothing succeeds");
    rt.subagents()
        .interrupt(
            SessionId::new(),
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .expect("an interrupt of an unbound target is an accepted no-op");
    assert!(recorder.events().is_empty());
    assert_eq!(rt.agents().list().await.len(), 1);
    assert_eq!(
        parent.agent().log().last_turn(),
        0,
        "the parent was never woken"
    );
}

// CONT-09 CONT-10
#[actix_rt::test]
async fn a_depth_cap_is_checked_before_the_provider_is_asked() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, _) = fixture(&model).await;
    let error = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go")).max_depth(0),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DepthExceeded);
    assert!(
        error.message().contains("exceeds maxDepth 0") || error.message().contains("max_depth 0"),
        "{error}"
    );
    let error = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go")).max_depth(1 << 60),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidMaxDepth);
    assert_eq!(rt.agents().list().await.len(), 1, "no child was created");
}

// CONT-11 CONT-12 CONT-94
#[actix_rt::test]
async fn the_descriptor_records_declared_composition_and_the_resolved_route() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    rt.tools()
        .register(subagents::Tool::new(
            "noop",
            "does nothing",
            json!({"type": "object"}),
            |_args, _ctx| Box::pin(async { Ok(subagents::ToolOutput::text("done")) }),
        ))
        .unwrap();
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "filtered", parent.agent(), text("go"))
                .tool_filter(ToolFilter::deny(["noop"]))
                .agent_options(ChildAgentOptions {
                    provider: Some("scripted".into()),
                    model: Some("child-model".into()),
                    max_tokens: None,
                }),
        )
        .await
        .unwrap();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(
        descriptors(&events),
        [json!({
            "version": 2, "mode": "continuable", "provider": "spawn", "label": "filtered",
            "agentProvider": "scripted", "agentModel": "child-model",
            "toolFilter": {"deny": ["noop"]}
        })]
    );
    // A cold resume uses the recorded route.
    followup_child(&rt, parent.agent(), started.child_id, "again")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    assert_eq!(
        last_request_of(&model, started.child_id).model,
        "child-model"
    );
}

// CONT-16
#[actix_rt::test]
async fn follow_ups_to_a_running_child_queue_in_its_own_inbox() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("first").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    let first = followup_child(&rt, parent.agent(), started.child_id, "first follow-up")
        .await
        .unwrap();
    let second = followup_child(&rt, parent.agent(), started.child_id, "second follow-up")
        .await
        .unwrap();
    assert_ne!(first, second);
    assert_eq!(
        rt.agents().get(started.child_id).await.unwrap(),
        child,
        "the same Activation's agent"
    );
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(
        delivered(&events),
        ["child task", "first follow-up", "second follow-up"]
    );
    assert_eq!(ends_of(&recorder, started.child_id).len(), 1, "one epoch");
}

// CONT-17 CONT-84
#[actix_rt::test]
async fn a_settled_child_is_cold_resumed_into_a_new_epoch() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    assert!(
        rt.agents().get(started.child_id).await.is_none(),
        "settled children are released"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    followup_child(&rt, parent.agent(), started.child_id, "continue please")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(delivered(&events), ["child task", "continue please"]);
    assert_eq!(
        descriptors(&events).len(),
        1,
        "a resume never re-appends the descriptor"
    );
    let starts: Vec<_> = recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            SubagentEvent::Start(info) if info.id == started.child_id => Some(info),
            _ => None,
        })
        .collect();
    let ends = ends_of(&recorder, started.child_id);
    assert_eq!(starts.len(), 2);
    assert_ne!(starts[0].run_id, starts[1].run_id);
    assert_eq!(
        ends.iter().map(|end| end.info.run_id).collect::<Vec<_>>(),
        starts.iter().map(|info| info.run_id).collect::<Vec<_>>()
    );
    assert!(starts
        .iter()
        .all(|info| info.provider == "spawn" && info.local));
    assert!(ends
        .iter()
        .all(|end| end.stop_reason == StopReason::Completed));
}

// CONT-51
#[actix_rt::test]
async fn each_epoch_reports_its_own_output() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("first answer"),
        ScriptStep::text("parent reads the notice"),
        ScriptStep::text("second answer"),
    ]);
    model.set_fallback(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    within("the parent's notice turn", parent.agent().when_idle()).await;
    followup_child(&rt, parent.agent(), started.child_id, "again")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let ends = ends_of(&recorder, started.child_id);
    assert_eq!(ends[0].last_assistant_message, Some(text("first answer")));
    assert_eq!(ends[1].last_assistant_message, Some(text("second answer")));
}

// CONT-20 CONT-90
#[actix_rt::test]
async fn only_the_exact_live_direct_parent_may_follow_up() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    let stranger = root(&rt).await;
    let error = followup_child(&rt, stranger.agent(), started.child_id, "hi")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unauthorized);
    assert!(error
        .message()
        .contains("belongs to another parent session"));
    // A stale reference (its agent was disposed) is refused too.
    let stale = stranger.agent().clone();
    stranger.dispose().await.unwrap();
    let error = followup_child(&rt, &stale, started.child_id, "hi")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unauthorized);
}

// CONT-21 CONT-22
#[actix_rt::test]
async fn a_child_without_a_continuable_descriptor_is_not_resumable() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, _) = fixture(&model).await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("once")),
        )
        .await
        .unwrap();
    let one_shot = run.id();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    let error = followup_child(&rt, parent.agent(), one_shot, "again")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotResumable);
    assert!(error.message().contains("no supported continuation state"));
    let error = followup_child(&rt, parent.agent(), SessionId::new(), "hello")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotResumable);
}

// CONT-64 CONT-74
#[actix_rt::test]
async fn the_parent_is_told_what_the_child_finished_with() {
    let model = ScriptedModel::with_script([ScriptStep::text("the answer")]);
    model.set_fallback(ScriptStep::text("noted"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    idle_after_turns(parent.agent(), 1).await;
    let events = parent.agent().log().events();
    let notices: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage(message) => match &message.source {
                MessageSource::SubagentSettledNotice {
                    summary,
                    sender_session_id,
                } => Some((message.clone(), summary.clone(), *sender_session_id)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 1, "exactly one notice");
    let (message, summary, sender) = &notices[0];
    assert_eq!(*sender, started.child_id);
    let expected = format!(
        "Background subagent {} finished and will do no further work unless you send it more.",
        started.child_id
    );
    assert_eq!(summary, &expected);
    assert_eq!(
        message.content,
        vec![
            ContentBlock::text(expected),
            ContentBlock::text("Its closing message:"),
            ContentBlock::text("the answer"),
        ]
    );
    assert_eq!(
        parent.agent().log().last_turn(),
        1,
        "one ordinary parent turn"
    );
}

// CONT-66 CONT-49
#[actix_rt::test]
async fn the_notice_and_end_carry_the_terminal_reason() {
    let model = ScriptedModel::with_script([ScriptStep::max_tokens("half an ans")]);
    model.set_fallback(ScriptStep::text("noted"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "child task").await;
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::MaxTokens);
    eventually("the notice", || {
        notices(parent.agent()).iter().any(|notice| {
            notice.contains("ran out of room before it finished.") && notice.contains("half an ans")
        })
    })
    .await;
}

// CONT-96
#[actix_rt::test]
async fn an_interrupt_parks_accepted_follow_ups_until_a_waking_send() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("slow").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    followup_child(&rt, parent.agent(), started.child_id, "B")
        .await
        .unwrap();
    followup_child(&rt, parent.agent(), started.child_id, "C")
        .await
        .unwrap();
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .unwrap();
    gate.release();
    let child = rt.agents().get(started.child_id).await.unwrap();
    within("the interrupted turn", child.when_idle()).await;
    let status = child.status().await.unwrap();
    assert_eq!(status.next_turn, 2, "B and C stay parked");
    assert!(
        rt.agents().get(started.child_id).await.is_some(),
        "still resident"
    );
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 1);
    followup_child(&rt, parent.agent(), started.child_id, "D")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    assert_eq!(delivered(&events), ["task", "B", "C", "D"]);
    assert_eq!(
        turn_ends(&events),
        [
            TurnEndReason::Aborted {
                reason: CancelCause::User
            },
            TurnEndReason::Completed,
            TurnEndReason::Completed,
            TurnEndReason::Completed
        ]
    );
}

// CONT-98 CONT-100 CONT-101 CONT-102
#[actix_rt::test]
async fn interrupt_authority_is_checked_against_the_live_target() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("slow").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let wrong = rt
        .subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: SessionId::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), ErrorCode::Unauthorized);
    assert!(wrong
        .message()
        .contains("belongs to another parent session"));
    let child = rt.agents().get(started.child_id).await.unwrap();
    let itself = rt
        .subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::Ancestor(child.clone()),
        )
        .await
        .unwrap_err();
    assert!(itself.message().contains("cannot interrupt itself"));
    let stranger = root(&rt).await;
    let unrelated = rt
        .subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::Ancestor(stranger.agent().clone()),
        )
        .await
        .unwrap_err();
    assert!(unrelated.message().contains("not a live descendant"));
    let stale = stranger.agent().clone();
    stranger.dispose().await.unwrap();
    let stale_error = rt
        .subagents()
        .interrupt(SessionId::new(), InterruptAuthority::Ancestor(stale))
        .await
        .unwrap_err();
    assert!(stale_error.message().contains("exact live ancestor"));
    // Absent targets are accepted no-ops under either authority.
    rt.subagents()
        .interrupt(
            SessionId::new(),
            InterruptAuthority::Ancestor(parent.agent().clone()),
        )
        .await
        .unwrap();
    // None of the refusals touched the target.
    assert_eq!(child.status().await.unwrap().turn, Some(1));
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        ends_of(&recorder, started.child_id)[0].stop_reason,
        StopReason::Completed
    );
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::User {
                parent_session_id: parent.agent().id(),
            },
        )
        .await
        .expect("a settled target is a no-op");
}

// CONT-63
#[actix_rt::test]
async fn a_wakeup_report_gives_an_idle_parent_one_turn() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("working").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    let id = rt
        .subagents()
        .report_from(
            &child,
            text("halfway"),
            ReportOptions::new(ReportDelivery::Wakeup),
        )
        .await
        .unwrap();
    idle_after_turns(parent.agent(), 1).await;
    let report = parent
        .agent()
        .log()
        .events()
        .into_iter()
        .find_map(|event| match event.kind {
            EventKind::UserMessage(message) if message.id == id => Some(message),
            _ => None,
        })
        .expect("the report is in the parent's log");
    assert_eq!(
        report.source,
        MessageSource::SubagentReportRelay {
            sender_session_id: started.child_id
        }
    );
    assert_eq!(
        report.content,
        vec![
            ContentBlock::text(format!(
                "Background subagent {} reported:",
                started.child_id
            )),
            ContentBlock::text("halfway"),
        ]
    );
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    idle_after_turns(parent.agent(), 2).await;
}

// CONT-65
#[actix_rt::test]
async fn a_quiet_report_still_leaves_one_settled_notice() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("working").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    rt.subagents()
        .report_from(
            &child,
            text("fyi"),
            ReportOptions::new(ReportDelivery::Quiet),
        )
        .await
        .unwrap();
    assert_eq!(
        parent.agent().log().last_turn(),
        0,
        "a quiet report wakes nobody"
    );
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    idle_after_turns(parent.agent(), 1).await;
    let notices = parent
        .agent()
        .log()
        .events()
        .iter()
        .filter(|event| matches!(&event.kind, EventKind::UserMessage(m) if matches!(m.source, MessageSource::SubagentSettledNotice { .. })))
        .count();
    assert_eq!(notices, 1);
}

// A report from something that is not a resident child is refused.
#[actix_rt::test]
async fn only_a_resident_child_may_report() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, _) = fixture(&model).await;
    let error = rt
        .subagents()
        .report_from(
            parent.agent(),
            text("me?"),
            ReportOptions::new(ReportDelivery::Wakeup),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unauthorized);
}

// CONT-19 CONT-26 CONT-76
#[actix_rt::test]
async fn a_waiting_child_is_woken_and_settles_after_its_grandchild() {
    let child_gate = Gate::new();
    let grand_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child works").gated(&child_gate));
    model.push(ScriptStep::text("grandchild works").gated(&grand_gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let (started, child, grand) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    child_gate.release();
    within("the child's turn", child.when_idle()).await;
    // Waiting: idle, but it owns a running grandchild.
    assert!(
        rt.agents().get(started.child_id).await.is_some(),
        "a waiting child stays"
    );
    followup_child(&rt, parent.agent(), started.child_id, "while waiting")
        .await
        .unwrap();
    assert_eq!(
        rt.agents().get(started.child_id).await.unwrap(),
        child,
        "woken, not resumed"
    );
    grand_gate.release();
    settled(&recorder, started.child_id, 1).await;
    let events = persisted(&rt, started.child_id).await;
    let texts = delivered(&events);
    assert_eq!(texts[..2], ["child task", "while waiting"]);
    assert!(
        texts.iter().any(|text| text.contains(&format!(
            "{} finished and will do no further work",
            grand.child_id
        ))),
        "the grandchild's notice reached the child: {texts:?}"
    );
    assert!(rt.agents().get(grand.child_id).await.is_none());
}

// CONT-27 CONT-81
#[actix_rt::test]
async fn a_top_level_parent_is_outside_the_waiting_graph() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    assert!(rt.agents().get(parent.agent().id()).await.is_some());
    // A parent disposed before its child settles: the child still settles.
    let gate = Gate::new();
    model.push(ScriptStep::text("slow").gated(&gate));
    let other = root(&rt).await;
    let other_recorder = SeamRecorder::new(&rt, EventScope::Key(other.agent().id()));
    let second = start_continuable(&rt, other.agent(), "task").await;
    gate.reached().await;
    other.dispose().await.unwrap();
    gate.release();
    settled(&other_recorder, second.child_id, 1).await;
    assert_eq!(
        ends_of(&other_recorder, second.child_id)[0].stop_reason,
        StopReason::Completed
    );
}

// CONT-31 CONT-95 CONT-78
#[actix_rt::test]
async fn shutdown_drains_every_forest_child_first() {
    let child_gate = Gate::new();
    let grand_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child").gated(&child_gate));
    model.push(ScriptStep::text("grandchild").gated(&grand_gate));
    let (rt, parent, _) = fixture(&model).await;
    let (started, _child, grand) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    let disposed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&disposed);
    let _subscription =
        rt.events()
            .subscribe(EventScope::All, move |event: &subagents::AgentEvent| {
                if matches!(event.kind, subagents::AgentEventKind::Disposed) {
                    sink.lock().unwrap().push(event.agent);
                }
            });
    within("shutdown", rt.shutdown()).await.unwrap();
    let order = disposed.lock().unwrap().clone();
    let grand_at = order.iter().position(|id| *id == grand.child_id).unwrap();
    let child_at = order.iter().position(|id| *id == started.child_id).unwrap();
    assert!(
        grand_at < child_at,
        "the grandchild is released first: {order:?}"
    );
    assert!(rt.agents().list().await.is_empty());
    // The child's session survives the process-local teardown, and the grandchild's notice
    // did not wake the tearing-down child into another turn.
    let child_events = persisted(&rt, started.child_id).await;
    let turns = child_events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::TurnStart { .. }))
        .count();
    assert_eq!(turns, 1, "no turn after the teardown began");
}

// CONT-42 CONT-91
#[actix_rt::test]
async fn once_a_manager_drain_begins_nothing_is_admitted() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("slow").gated(&gate));
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(
        subagents::MemoryStore::new(),
    )));
    let rt = crate::support::seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        faults.clone(),
    )
    .await;
    let parent = root(&rt).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    // The drain stays under way while the child's teardown waits to release its lease.
    faults.hold(StoreOperation::ReleaseLease);
    let shutdown = tokio::spawn({
        let rt = rt.clone();
        async move { rt.shutdown().await }
    });
    gate.release();
    within("the child's lease release to be held", faults.held_calls(1)).await;
    let refused = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "t",
            parent.agent(),
            text("new"),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Draining);
    let refused = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new("spawn", "t", &child, text("new")))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        ErrorCode::Draining,
        "nothing below the draining child"
    );
    let refused = followup_child(&rt, parent.agent(), started.child_id, "late")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Draining);
    faults.release(StoreOperation::ReleaseLease);
    within("shutdown", shutdown).await.unwrap().unwrap();
}

// CONT-32 CONT-33
#[actix_rt::test]
async fn a_scoped_drain_closes_one_forest_only() {
    let p_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("p child").gated(&p_gate));
    let rt = seam_runtime(&model).await;
    let p = root(&rt).await;
    let s = root(&rt).await;
    let p_child = start_continuable(&rt, p.agent(), "p task").await;
    p_gate.reached().await;
    let s_gate = Gate::new();
    model.push(ScriptStep::text("s child").gated(&s_gate));
    let s_child = start_continuable(&rt, s.agent(), "s task").await;
    s_gate.reached().await;
    within(
        "the scoped drain",
        rt.subagents()
            .drain_continuable_descendants(&[p.agent().clone()]),
    )
    .await
    .unwrap();
    assert!(
        rt.agents().get(p_child.child_id).await.is_none(),
        "P's child is gone"
    );
    assert!(
        rt.agents().get(s_child.child_id).await.is_some(),
        "S's forest is untouched"
    );
    followup_child(&rt, s.agent(), s_child.child_id, "still fine")
        .await
        .expect("S's child accepts follow-ups");
    let refused = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "t",
            p.agent(),
            text("new"),
        ))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        ErrorCode::Draining,
        "the cutoff persists below P"
    );
    let refused = followup_child(&rt, p.agent(), p_child.child_id, "again")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::Draining);
    s_gate.release();
    // A stale root cannot close a live forest.
    let stale = p.agent().clone();
    p.dispose().await.unwrap();
    rt.subagents()
        .drain_continuable_descendants(&[stale])
        .await
        .unwrap();
}

// CONT-50 CONT-88
#[actix_rt::test]
async fn the_callers_token_owns_a_follow_up_only_until_acceptance() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("slow").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let aborted = CancellationToken::new();
    aborted.cancel();
    let error = rt
        .subagents()
        .followup(
            parent.agent(),
            started.child_id,
            text("never"),
            FollowupOptions::new(MessageSource::User).cancel(aborted),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    let token = CancellationToken::new();
    rt.subagents()
        .followup(
            parent.agent(),
            started.child_id,
            text("kept"),
            FollowupOptions::new(MessageSource::User).cancel(token.clone()),
        )
        .await
        .unwrap();
    token.cancel();
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    let texts = delivered(&persisted(&rt, started.child_id).await);
    assert_eq!(texts, ["task", "kept"]);
}

// CONT-06
#[actix_rt::test]
async fn a_start_cancelled_before_acceptance_leaves_nothing() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let token = CancellationToken::new();
    token.cancel();
    let error = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go")).cancel(token),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    assert_eq!(rt.agents().list().await.len(), 1);
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(recorder.events().is_empty(), "no lifecycle edge");
}

// CONT-15
#[actix_rt::test]
async fn a_persona_is_recorded_and_reapplied_on_cold_resume() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "scoped", parent.agent(), text("go"))
                .persona("You are scoped."),
        )
        .await
        .unwrap();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        descriptors(&persisted(&rt, started.child_id).await)[0]["persona"],
        "You are scoped."
    );
    followup_child(&rt, parent.agent(), started.child_id, "more")
        .await
        .unwrap();
    settled(&recorder, started.child_id, 2).await;
    let system = last_request_of(&model, started.child_id)
        .system
        .unwrap_or_default();
    assert!(system.contains("You are scoped."), "{system}");
    assert!(delivered(&persisted(&rt, started.child_id).await).contains(&"more".to_owned()));
}

// CONT-61 CONT-67
#[actix_rt::test]
async fn a_child_whose_first_step_is_refused_settles_as_a_refusal() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (hook, parent_id) =
        crate::support::sparing_the_parent(|_, _| subagents::host::PreStepDecision::Reject);
    let rt = crate::support::seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .pre_step_hook(hook),
    )
    .await;
    let parent = root(&rt).await;
    *parent_id.lock().unwrap() = Some(parent.agent().id());
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    let end = &ends_of(&recorder, started.child_id)[0];
    assert_eq!(end.stop_reason, StopReason::Refusal);
    assert_eq!(end.last_assistant_message, None);
    eventually("the notice", || {
        notices(parent.agent()).iter().any(|notice| {
            notice.contains("declined the task.") && notice.contains("It left no closing message.")
        })
    })
    .await;
}

// CONT-13 CONT-18
#[actix_rt::test]
async fn a_cold_resume_needs_neither_the_provider_nor_an_undeclared_route() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = Runtime::builder()
        .store(subagents::MemoryStore::new())
        .model("scripted", model.clone())
        .build()
        .unwrap();
    let registration = rt
        .subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let started = start_continuable(&rt, parent.agent(), "task").await;
    settled(&recorder, started.child_id, 1).await;
    registration.remove();
    followup_child(&rt, parent.agent(), started.child_id, "after removal")
        .await
        .expect("a cold resume never asks the provider");
    settled(&recorder, started.child_id, 2).await;
    let request = last_request_of(&model, started.child_id);
    assert_eq!(request.model, "", "no model the descriptor never declared");
    let starts: Vec<String> = recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            SubagentEvent::Start(info) => Some(info.provider),
            _ => None,
        })
        .collect();
    assert_eq!(starts, ["spawn", "spawn"]);
}

// CONT-97 CONT-99
#[actix_rt::test]
async fn an_interrupt_stops_only_its_target() {
    let child_gate = Gate::new();
    let grand_gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("child").gated(&child_gate));
    model.push(ScriptStep::text("grandchild").gated(&grand_gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let (started, child, grand) = held_forest(&rt, parent.agent(), &child_gate, &grand_gate).await;
    // A deep exact live ancestor interrupts the child only.
    rt.subagents()
        .interrupt(
            started.child_id,
            InterruptAuthority::Ancestor(parent.agent().clone()),
        )
        .await
        .unwrap();
    child_gate.release();
    within("the child's interrupted turn", child.when_idle()).await;
    let grand_agent = rt.agents().get(grand.child_id).await.unwrap();
    assert_eq!(
        grand_agent.status().await.unwrap().turn,
        Some(1),
        "the grandchild runs on"
    );
    assert!(
        rt.agents().get(started.child_id).await.is_some(),
        "the child waits"
    );
    grand_gate.release();
    settled(&recorder, started.child_id, 1).await;
    let grand_events = grand_agent.log().events();
    assert_eq!(turn_ends(&grand_events), [TurnEndReason::Completed]);
    let child_events = persisted(&rt, started.child_id).await;
    assert_eq!(
        turn_ends(&child_events)[0],
        TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }
    );
}

// Regression: sled 0.34's concurrent `flush_async` calls could stall each other for good, and
// every continuable epoch ends with a flush: many children settling at once on sled hung. The
// stall showed only in optimized builds (`subagents load --children 40 --roots 1 --workers 1`
// in release); store::group_flush's unit test pins the one-flush-at-a-time rule that fixed it.
#[actix_rt::test]
async fn many_children_settling_at_once_on_sled_all_settle() {
    let dir = tempfile::tempdir().unwrap();
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = crate::support::seam_runtime_on(
        Runtime::builder().model("scripted", model),
        Arc::new(subagents::SledStore::open(dir.path()).unwrap()),
    )
    .await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    for _ in 0..60 {
        start_continuable(&rt, parent.agent(), "task").await;
    }
    recorder.wait_for_count(120).await;
    assert_eq!(
        recorder
            .events()
            .iter()
            .filter(|event| matches!(event, subagents::SubagentEvent::End(_)))
            .count(),
        60
    );
    within("shutdown", rt.shutdown()).await.unwrap();
}
