//! Bad input at the seam: an empty prompt, follow-up or report, a budget that cannot be
//! recorded, an id that names no child. Each is refused with a typed error that names what
//! is wrong, and leaves nothing behind.

use std::time::Duration;

use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    Budget, ContentBlock, ContinuableStartSpec, ErrorCode, EventKind, EventScope, FollowupOptions,
    MessageSource, ReportDelivery, ReportOptions, SessionId, SubagentStartRequest,
};

use crate::support::{
    delivered, followup_child, persisted, root, seam_runtime, settled, start_continuable, text,
    SeamRecorder,
};

/// Content that says nothing: no block, an empty text, a blank one.
fn empties() -> [Vec<ContentBlock>; 3] {
    [
        vec![],
        text(""),
        vec![ContentBlock::text("  \n"), ContentBlock::text("")],
    ]
}

// An empty start prompt, follow-up or report would run (or wake) a turn with no input: each
// is refused INVALID_ARGS before anything exists, and the child keeps only what it was told.
#[actix_rt::test]
async fn empty_content_is_refused_before_anything_runs() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    for empty in empties() {
        let refused = [
            rt.subagents()
                .start_continuable(ContinuableStartSpec::new(
                    "spawn",
                    "t",
                    parent.agent(),
                    empty.clone(),
                ))
                .await
                .map(|_| ())
                .unwrap_err(),
            rt.subagents()
                .start(
                    "spawn",
                    SubagentStartRequest::new(parent.agent(), empty.clone()),
                )
                .await
                .map(|_| ())
                .unwrap_err(),
        ];
        for error in refused {
            assert_eq!(error.code(), ErrorCode::InvalidArgs, "{error}");
            assert!(error.message().contains("start prompt"), "{error}");
        }
    }
    assert_eq!(rt.agents().list().await.len(), 1, "no child was created");
    assert!(recorder.events().is_empty(), "no lifecycle edge");

    let started = start_continuable(&rt, parent.agent(), "task").await;
    gate.reached().await;
    let child = rt.agents().get(started.child_id).await.unwrap();
    for empty in empties() {
        let error = rt
            .subagents()
            .followup(
                parent.agent(),
                started.child_id,
                empty.clone(),
                FollowupOptions::new(MessageSource::User),
            )
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgs, "{error}");
        let error = rt
            .subagents()
            .report_from(&child, empty, ReportOptions::new(ReportDelivery::Wakeup))
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgs, "{error}");
    }
    gate.release();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(
        delivered(&persisted(&rt, started.child_id).await),
        ["task"],
        "only the prompt reached the child"
    );
    assert!(
        crate::support::notices(parent.agent()).len() <= 1,
        "no report reached the parent"
    );
}

/// The `wallTimeMs` a child's descriptor recorded.
async fn recorded_wall_time(rt: &subagents::Runtime, child: SessionId) -> serde_json::Value {
    persisted(rt, child)
        .await
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Extension { event_type, data } if event_type == "subagent/descriptor" => {
                Some(data["budget"]["wallTimeMs"].clone())
            }
            _ => None,
        })
        .expect("a descriptor")
}

// A wall-time limit is recorded in whole milliseconds: under one it is refused (it used to be
// recorded as 0, a limit no turn could meet), and a fraction is rounded up, so the limit in
// force after a cold resume is the one the caller set or more, never less.
#[actix_rt::test]
async fn a_wall_time_budget_under_a_millisecond_is_refused_and_fractions_round_up() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let tiny = Budget::unlimited().wall_time(Duration::from_micros(500));
    let error = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go")).budget(tiny),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidBudget, "{error}");
    assert!(error.message().contains("1 ms"), "{error}");

    let started = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "t", parent.agent(), text("go"))
                .budget(Budget::unlimited().wall_time(Duration::from_micros(60_000_500))),
        )
        .await
        .unwrap();
    settled(&recorder, started.child_id, 1).await;
    assert_eq!(recorded_wall_time(&rt, started.child_id).await, 60_001);
    let error = rt
        .subagents()
        .followup(
            parent.agent(),
            started.child_id,
            text("more"),
            FollowupOptions::new(MessageSource::User).budget(tiny),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidBudget, "{error}");
}

// CONT-22's error names the id the caller asked for, never the parent's.
#[actix_rt::test]
async fn a_follow_up_to_an_unknown_id_names_that_id() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let unknown = SessionId::new();
    let error = followup_child(&rt, parent.agent(), unknown, "anyone?")
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotResumable);
    assert!(error.message().contains(&unknown.to_string()), "{error}");
    assert!(
        !error.message().contains(&parent.agent().id().to_string()),
        "{error}"
    );
}

// A follow-up retried under its id (its first answer was lost) is accepted once: sent again
// while pending, or long after its turn ran and the child was released, it answers the first
// acceptance, runs no second turn and opens no second epoch.
#[actix_rt::test]
async fn a_followup_retried_under_its_id_is_accepted_once() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    model.push(ScriptStep::text("held").gated(&gate));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let child = start_continuable(&rt, parent.agent(), "first")
        .await
        .child_id;
    gate.reached().await;
    let id = subagents::MessageId::new();
    let send = || {
        rt.subagents().followup(
            parent.agent(),
            child,
            text("once"),
            FollowupOptions::new(MessageSource::User).message_id(id),
        )
    };
    // Pending behind the held turn, then sent again.
    assert_eq!(send().await.unwrap(), id);
    assert_eq!(send().await.unwrap(), id);
    gate.release();
    settled(&recorder, child, 1).await;
    // Released; sent again: still the first acceptance, read from its stored log, and the
    // child is not resumed for it.
    assert_eq!(send().await.unwrap(), id);
    assert!(rt.agents().get(child).await.is_none(), "nothing resumed");
    let events = persisted(&rt, child).await;
    assert_eq!(delivered(&events), ["first", "once"], "each ran once");
    let starts = recorder
        .events()
        .iter()
        .filter(
            |event| matches!(event, subagents::SubagentEvent::Start(start) if start.id == child),
        )
        .count();
    assert_eq!(starts, 1, "one epoch: the repeat opened none");
    rt.shutdown().await.unwrap();
}
