//! Per-child budgets (beyond the TypeScript runtime): limits on turns, model tokens and wall time, set
//! at start, recorded in a version-3 descriptor, carried across cold resume and enforced by the
//! runtime; the turn that crosses a limit ends `budget-exhausted`, the parent's settled notice
//! names the limit, and follow-ups are refused until one raises it.

use std::time::Duration;

use serde_json::json;
use subagents::testing::{Gate, ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, Budget, BudgetLimit, ContinuableStart, ContinuableStartSpec, ErrorCode, EventKind,
    FollowupOptions, MessageSource, Runtime, SessionId, StopReason, TurnEndReason,
};

use crate::support::{
    ends_of, eventually, fixture, followup_child, notices, persisted, settled, text, turn_ends,
};

async fn start_with(
    rt: &Runtime,
    parent: &AgentHandle,
    prompt: &str,
    budget: Budget,
) -> ContinuableStart {
    rt.subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "budgeted", parent.agent(), text(prompt))
                .budget(budget),
        )
        .await
        .expect("the budgeted start is accepted")
}

async fn raise(
    rt: &Runtime,
    parent: &AgentHandle,
    child: SessionId,
    prompt: &str,
    budget: Budget,
) -> subagents::Result<subagents::MessageId> {
    rt.subagents()
        .followup(
            parent.agent(),
            child,
            text(prompt),
            FollowupOptions::new(MessageSource::User).budget(budget),
        )
        .await
}

fn budget_records(events: &[subagents::SessionEvent]) -> Vec<serde_json::Value> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::Extension { event_type, data } if event_type == "subagent/budget" => {
                Some(data.clone())
            }
            _ => None,
        })
        .collect()
}

#[actix_rt::test]
async fn a_spent_turn_budget_refuses_follow_ups_until_one_raises_it() {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_with(&rt, &parent, "one", Budget::unlimited().turns(1)).await;
    let child = started.child_id;
    settled(&recorder, child, 1).await;
    // The one allowed turn completed normally: reaching a limit is not crossing it.
    assert_eq!(
        ends_of(&recorder, child)[0].stop_reason,
        StopReason::Completed
    );
    let requests = model.request_count();
    let refused = followup_child(&rt, parent.agent(), child, "two")
        .await
        .expect_err("the turn budget is spent");
    assert_eq!(refused.code(), ErrorCode::BudgetExhausted);
    assert!(refused.message().contains("turns budget (1 of 1 turns)"));
    // Refused from the store's record: nothing was resumed, nothing ran.
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert_eq!(ends_of(&recorder, child).len(), 1);
    assert_eq!(model.request_count(), requests);
    // A raise that the spending already exhausts changes nothing.
    let still = raise(&rt, &parent, child, "two", Budget::unlimited().turns(1))
        .await
        .expect_err("a raise to the spent amount does not lift the limit");
    assert_eq!(still.code(), ErrorCode::BudgetExhausted);
    assert!(budget_records(&persisted(&rt, child).await).is_empty());
    // A real raise is accepted, recorded in the child's log and carried by its cold resume.
    raise(&rt, &parent, child, "two", Budget::unlimited().turns(2))
        .await
        .expect("the raised follow-up is accepted");
    settled(&recorder, child, 2).await;
    assert_eq!(
        ends_of(&recorder, child)[1].stop_reason,
        StopReason::Completed
    );
    let events = persisted(&rt, child).await;
    assert_eq!(budget_records(&events), [json!({"version": 1, "turns": 2})]);
    let refused = followup_child(&rt, parent.agent(), child, "three")
        .await
        .expect_err("the raised budget is spent too");
    assert_eq!(refused.code(), ErrorCode::BudgetExhausted);
}

#[actix_rt::test]
async fn the_step_that_reaches_the_token_limit_ends_the_turn_budget_exhausted() {
    // Step one asks for a tool (15 tokens); a second step would follow if the budget allowed.
    let model = ScriptedModel::repeating(ScriptStep::text("unreachable"));
    model.push(ScriptStep::tool_call("c1", "no_such_tool", json!({})));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_with(&rt, &parent, "spend", Budget::unlimited().tokens(15)).await;
    let child = started.child_id;
    settled(&recorder, child, 1).await;
    let end = &ends_of(&recorder, child)[0];
    assert_eq!(end.stop_reason, StopReason::BudgetExhausted);
    assert_eq!(end.stop_reason.as_str(), "budget-exhausted");
    let events = persisted(&rt, child).await;
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::BudgetExhausted {
            limit: BudgetLimit::Tokens
        }]
    );
    // The crossing step's tool call still got its result: the history stays whole.
    assert!(events
        .iter()
        .any(|event| matches!(event.kind, EventKind::ToolResult { .. })));
    assert_eq!(
        model
            .requests()
            .iter()
            .filter(|request| request.session_id == Some(child))
            .count(),
        1,
        "no step follows the one that reached the limit"
    );
    // The parent's notice names the limit.
    let parent_ref = parent.agent().clone();
    eventually("the settled notice", || !notices(&parent_ref).is_empty()).await;
    let notice = notices(&parent_ref).remove(0);
    assert!(notice.contains("used up its token budget."), "{notice}");
    assert!(notice.contains("until a follow-up raises that budget"));
    let refused = followup_child(&rt, parent.agent(), child, "more")
        .await
        .expect_err("the token budget is spent");
    assert_eq!(refused.code(), ErrorCode::BudgetExhausted);
    assert!(refused.message().contains("15 of 15 tokens"));
}

#[actix_rt::test]
async fn the_wall_time_limit_cancels_the_turn_where_it_stands() {
    let gate = Gate::new();
    let model = ScriptedModel::repeating(ScriptStep::text("later"));
    // Never released: only the wall-time limit can end this turn.
    model.push(ScriptStep::text("too slow").gated(&gate));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_with(
        &rt,
        &parent,
        "slow",
        Budget::unlimited().wall_time(Duration::from_millis(40)),
    )
    .await;
    let child = started.child_id;
    settled(&recorder, child, 1).await;
    assert_eq!(
        ends_of(&recorder, child)[0].stop_reason,
        StopReason::BudgetExhausted
    );
    let events = persisted(&rt, child).await;
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::BudgetExhausted {
            limit: BudgetLimit::WallTime
        }]
    );
    let refused = followup_child(&rt, parent.agent(), child, "again")
        .await
        .expect_err("the wall time is spent");
    assert_eq!(refused.code(), ErrorCode::BudgetExhausted);
    assert!(refused.message().contains("wall-time budget"));
    // Lifting the wall-time limit (a budget without it) lets the child run again.
    raise(&rt, &parent, child, "again", Budget::unlimited())
        .await
        .expect("a budget without the limit lifts it");
    settled(&recorder, child, 2).await;
    assert_eq!(
        ends_of(&recorder, child)[1].stop_reason,
        StopReason::Completed
    );
    gate.release();
}

#[actix_rt::test]
async fn spending_is_carried_across_cold_resumes_from_the_log() {
    // Every answer spends 10 + 2 = 12 tokens.
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let started = start_with(&rt, &parent, "t1", Budget::unlimited().tokens(30)).await;
    let child = started.child_id;
    settled(&recorder, child, 1).await;
    let events = persisted(&rt, child).await;
    let descriptor = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Extension { event_type, data } if event_type == "subagent/descriptor" => {
                Some(data.clone())
            }
            _ => None,
        })
        .expect("a descriptor");
    assert_eq!(descriptor["version"], 3);
    assert_eq!(descriptor["budget"], json!({"tokens": 30}));
    // Two cold resumes: 24 tokens, then 36, which crosses the limit of 30.
    followup_child(&rt, parent.agent(), child, "t2")
        .await
        .expect("under budget");
    settled(&recorder, child, 2).await;
    assert_eq!(
        ends_of(&recorder, child)[1].stop_reason,
        StopReason::Completed
    );
    followup_child(&rt, parent.agent(), child, "t3")
        .await
        .expect("still under budget at admission");
    settled(&recorder, child, 3).await;
    assert_eq!(
        ends_of(&recorder, child)[2].stop_reason,
        StopReason::BudgetExhausted
    );
    let refused = followup_child(&rt, parent.agent(), child, "t4")
        .await
        .expect_err("spent across three epochs");
    assert_eq!(refused.code(), ErrorCode::BudgetExhausted);
    assert!(refused.message().contains("36 of 30 tokens"));
}

#[actix_rt::test]
async fn a_zero_limit_is_refused_and_leaves_nothing_behind() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (rt, parent, recorder) = fixture(&model).await;
    let refused = rt
        .subagents()
        .start_continuable(
            ContinuableStartSpec::new("spawn", "zero", parent.agent(), text("x"))
                .budget(Budget::unlimited().turns(0)),
        )
        .await
        .expect_err("a zero turn limit could never run");
    assert_eq!(refused.code(), ErrorCode::InvalidBudget);
    assert_eq!(subagents::testing::resident_count(rt.subagents()).await, 0);
    assert!(recorder.events().is_empty());
    let started = start_with(&rt, &parent, "ok", Budget::unlimited().turns(3)).await;
    settled(&recorder, started.child_id, 1).await;
    let refused = raise(
        &rt,
        &parent,
        started.child_id,
        "x",
        Budget::unlimited().tokens(0),
    )
    .await
    .expect_err("a zero raise is refused");
    assert_eq!(refused.code(), ErrorCode::InvalidBudget);
    assert_eq!(ends_of(&recorder, started.child_id).len(), 1);
}
