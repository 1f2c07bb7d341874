//! The agent inbox through the actor: follow-up FIFO, inject, steer, and cancel with and
//! without keep-inbox.

use futures::future::join_all;
use subagents::session::InboxTarget;
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentEventKind, AgentStatus, CancelCause, CreateAgent, EventKind, InboxPolicy, MessageSource,
    TurnEndReason,
};

use crate::support::{memory_runtime, text, turn_ends, user_texts, within, EventRecorder};

#[actix_rt::test]
async fn many_concurrent_followups_run_in_fifo_order_one_turn_each() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([ScriptStep::text("first").gated(&gate)]);
    model.set_fallback(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("m-first"), MessageSource::User)
        .await
        .unwrap();
    within("the first turn to reach the gate", gate.reached()).await;

    // 64 sends issued together from many futures while the first turn is held.
    let sends = (0..64).map(|i| {
        let agent = agent.clone();
        async move {
            agent
                .followup(text(&format!("m{i}")), MessageSource::User)
                .await
        }
    });
    let ids: Vec<_> = join_all(sends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let status = agent.status().await.unwrap();
    assert_eq!(
        status.next_turn, 64,
        "every follow-up waits in next-turn while turn 1 runs"
    );
    gate.release();
    within("the agent to drain its inbox", agent.when_idle()).await;

    let events = agent.log().events();
    let expected: Vec<String> = std::iter::once("m-first".to_owned())
        .chain((0..64).map(|i| format!("m{i}")))
        .collect();
    assert_eq!(
        user_texts(&events),
        expected,
        "turns consume follow-ups in send order"
    );
    assert_eq!(
        turn_ends(&events).len(),
        65,
        "each follow-up is its own turn"
    );
    assert!(turn_ends(&events)
        .iter()
        .all(|r| *r == TurnEndReason::Completed));
    let claimed: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::UserMessage(message) => Some(message.id),
            _ => None,
        })
        .skip(1)
        .collect();
    assert_eq!(
        claimed, ids,
        "the message ids entered the model history in acceptance order"
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn cancel_with_keep_inbox_parks_pending_work_until_a_waking_send() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([ScriptStep::text("never").gated(&gate)]);
    model.set_fallback(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let recorder = EventRecorder::new(&rt, agent.id());
    agent
        .followup(text("held"), MessageSource::User)
        .await
        .unwrap();
    within("the held turn", gate.reached()).await;
    agent
        .followup(text("a"), MessageSource::User)
        .await
        .unwrap();
    agent
        .followup(text("b"), MessageSource::User)
        .await
        .unwrap();

    agent
        .cancel(CancelCause::User, InboxPolicy::Keep)
        .await
        .unwrap();
    within("the cancelled turn to end", agent.when_idle()).await;
    let status = agent.status().await.unwrap();
    assert_eq!(
        status.status,
        AgentStatus::Idle,
        "parked work does not resume on its own"
    );
    assert_eq!((status.next_turn, status.parked), (2, true));
    assert_eq!(model.request_count(), 1, "no turn ran the parked messages");
    assert!(
        !recorder
            .kinds()
            .iter()
            .any(|k| matches!(k, AgentEventKind::InboxDiscarded { .. })),
        "keep-inbox discards nothing"
    );

    agent
        .followup(text("c"), MessageSource::User)
        .await
        .unwrap();
    within("the parked work to run", agent.when_idle()).await;
    let events = agent.log().events();
    assert_eq!(
        user_texts(&events),
        ["held", "a", "b", "c"],
        "parked items run first, in order"
    );
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
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn cancel_without_keep_inbox_discards_each_pending_message_exactly_once() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([ScriptStep::text("never").gated(&gate)]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let recorder = EventRecorder::new(&rt, agent.id());
    agent
        .followup(text("held"), MessageSource::User)
        .await
        .unwrap();
    within("the held turn", gate.reached()).await;
    let a = agent
        .followup(text("a"), MessageSource::User)
        .await
        .unwrap();
    let b = agent.inject(text("b"), MessageSource::User).await.unwrap();

    agent
        .cancel(CancelCause::User, InboxPolicy::Discard)
        .await
        .unwrap();
    agent
        .cancel(CancelCause::Parent, InboxPolicy::Discard)
        .await
        .unwrap();
    within("the cancelled turn to end", agent.when_idle()).await;

    let discarded: Vec<_> = recorder
        .kinds()
        .into_iter()
        .filter_map(|k| match k {
            AgentEventKind::InboxDiscarded { message } => Some(message),
            _ => None,
        })
        .collect();
    assert_eq!(
        discarded,
        [b, a],
        "next-step is cleared first, then next-turn, each once"
    );
    let events = agent.log().events();
    let canceled_splices = events
        .iter()
        .filter(|e| {
            matches!(
                &e.kind,
                EventKind::InboxSpliced {
                    outcome: Some(_),
                    ..
                }
            )
        })
        .count();
    assert_eq!(canceled_splices, 2, "one journaled cancellation per list");
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            reason: CancelCause::User
        }],
        "the first cause wins"
    );
    let status = agent.status().await.unwrap();
    assert_eq!((status.next_turn, status.next_step), (0, 0));
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn cancel_clears_the_inbox_even_when_idle() {
    let model = ScriptedModel::new();
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .inject(text("context"), MessageSource::User)
        .await
        .unwrap();
    assert_eq!(
        agent.status().await.unwrap().next_step,
        1,
        "inject waits while idle"
    );
    agent
        .cancel(CancelCause::User, InboxPolicy::Discard)
        .await
        .unwrap();
    assert_eq!(agent.status().await.unwrap().next_step, 0);
    assert_eq!(
        model.request_count(),
        0,
        "cancelling an idle agent starts nothing"
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn inject_during_a_running_turn_enters_its_next_step_without_a_new_turn() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "missing", serde_json::json!({})).gated(&gate),
        ScriptStep::text("done"),
    ]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("go"), MessageSource::User)
        .await
        .unwrap();
    within("step 1", gate.reached()).await;
    agent
        .inject(text("injected"), MessageSource::User)
        .await
        .unwrap();
    gate.release();
    within("the turn", agent.when_idle()).await;

    let events = agent.log().events();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed],
        "inject created no turn"
    );
    let step2 = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::StepStart { step: 2, .. }))
        .expect("a second step");
    assert!(
        matches!(&events[step2 + 1].kind, EventKind::UserMessage(m) if m.text() == "injected"),
        "the injected message opens step 2"
    );
    let second_request = &model.requests()[1];
    assert_eq!(
        second_request.messages.last().map(|m| m.text()).as_deref(),
        Some("injected")
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn steer_wakes_an_idle_agent_and_quiet_inject_rides_along() {
    let model = ScriptedModel::with_script([ScriptStep::text("steered")]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .inject(text("quiet"), MessageSource::User)
        .await
        .unwrap();
    agent
        .steer(text("steer"), MessageSource::User)
        .await
        .unwrap();
    within("the steered turn", agent.when_idle()).await;
    let events = agent.log().events();
    assert_eq!(
        user_texts(&events),
        ["quiet", "steer"],
        "one step claims all of next-step"
    );
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_waking_send_after_a_cancel_runs_as_a_later_turn() {
    let model = ScriptedModel::with_script([ScriptStep::Hang, ScriptStep::text("later")]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("hang"), MessageSource::User)
        .await
        .unwrap();
    let (cancelled, sent) = futures::join!(
        agent.cancel(CancelCause::User, InboxPolicy::Keep),
        agent.followup(text("after"), MessageSource::User)
    );
    cancelled.unwrap();
    sent.unwrap();
    within("both turns", agent.when_idle()).await;
    let events = agent.log().events();
    assert_eq!(user_texts(&events), ["hang", "after"]);
    assert!(matches!(
        turn_ends(&events)[..],
        [TurnEndReason::Aborted { .. }, TurnEndReason::Completed]
    ));
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn inbox_inserts_and_claims_are_journaled_and_observable() {
    let model = ScriptedModel::with_script([ScriptStep::text("hi")]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let recorder = EventRecorder::new(&rt, agent.id());
    let id = agent
        .followup(text("hello"), MessageSource::User)
        .await
        .unwrap();
    within("the turn", agent.when_idle()).await;
    assert_eq!(
        recorder.kinds()[..2],
        [
            AgentEventKind::InboxInserted {
                message: id,
                target: InboxTarget::NextTurn
            },
            AgentEventKind::InboxClaimed {
                message: id,
                turn: 1
            }
        ]
    );
    let events = agent.log().events();
    assert!(
        matches!(&events[0].kind, EventKind::InboxSpliced { inserted, .. } if inserted[0].id == id)
    );
    assert!(matches!(events[1].kind, EventKind::TurnStart { turn: 1 }));
    assert!(matches!(
        events[2].kind,
        EventKind::InboxSpliced {
            removed_count: Some(1),
            outcome: None,
            ..
        }
    ));
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_duplicate_pending_message_id_is_refused() {
    let model = ScriptedModel::new();
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let message = subagents::Message::user(text("once"), MessageSource::User);
    agent.inject_message(message.clone()).await.unwrap();
    let error = agent.inject_message(message).await.unwrap_err();
    assert_eq!(error.code(), subagents::ErrorCode::InvalidEvent);
    assert_eq!(
        agent.status().await.unwrap().next_step,
        1,
        "the refused send changed nothing"
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_reference_cannot_cancel_with_the_disposal_cause() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let error = agent
        .cancel(CancelCause::Disposed, InboxPolicy::Discard)
        .await
        .unwrap_err();
    assert_eq!(error.code(), subagents::ErrorCode::InvalidArgs);
    // The agent is untouched: registered, and still taking work.
    let events = crate::support::run_prompt(&agent, "still mine").await;
    assert_eq!(user_texts(&events), ["still mine"]);
    assert!(rt.agents().is_live(&agent).await);
    handle.dispose().await.unwrap();
}
