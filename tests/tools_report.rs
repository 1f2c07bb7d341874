//! The `report` tool, ported from providers-and-tools.md §2.3 with seed-differences rows 1-3:
//! delivery is `quiet` (inject: next-step context, no wake) or `wakeup` (followup: one later
//! parent turn, the default); `next-step` does not exist. The child calls `report` through its
//! own scripted model; the root parent answers from a second model (routes `child` and
//! `scripted`), so neither consumes the other's script.
//!
//! Skipped:
//! - TOOL-REPORT-13, aggregate variant: the `tool:report` section is the tool's own guidance,
//!   installed with it in one registration, so there is no separate rollback to fail. (The
//!   first half is ported.)
//! - TOOL-REPORT-14: the installation's disposer has one infallible step (the tool's
//!   revocation, which takes its guidance with it); there is no failure to aggregate.
//! - TOOL-REPORT-17, first half: no public hook holds a root parent between "disposal begun" and
//!   "unregistered". The second half (a disposed parent is an error result) is in
//!   `a_report_to_a_disposed_parent_is_an_error_result`.
//! - TOOL-REPORT-19, "no Jobs": this runtime has no jobs service at all.
//! Adapted: TOOL-REPORT-11's aborted signal cannot be arranged for a child-scoped tool mid-call,
//! so it is exercised on `report_from` with a cancelled token, as are the root and forged
//! senders (a root has no `report` tool; see TOOL-REPORT-01/02) and the drain.
//! TOOL-REPORT-05/06/07/09 follow seed-differences row 3; TOOL-REPORT-18 follows row 2.

use std::sync::{Arc, Mutex};

use serde_json::json;
use subagents::testing::{FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::tools::{ToolLayer, REPORT, SEND_MESSAGE};
use subagents::{
    install_control_tools, install_report_tool, AgentRef, AgentScope, AgentSnapshot, AgentStatus,
    CancellationToken, ContentBlock, ErrorCode, EventKind, GenerateRequest, MemoryStore, Message,
    MessageId, MessageSource, ReportDelivery, ReportOptions, SessionEvent, SessionId,
    SetupDisposer, ToolFilter,
};

use crate::support::{
    child_spec, eventually, followup_child, idle_after_turns, live, persisted, property_keys,
    released, run_prompt, settled, start_run, start_spec, text, tool_error_codes, tool_results,
    within, Routed,
};

mod fixture;
use fixture::*;

// TOOL-REPORT-01
#[actix_rt::test]
async fn report_is_granted_only_to_continuable_children() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let globals = ToolLayer::default().visible(t.rt.tools());
    assert!(
        globals.iter().all(|tool| tool.name() != REPORT),
        "not a global tool"
    );
    run_prompt(t.parent(), "hi").await;
    assert!(
        !offers_report(&t.parent_model.requests()[0]),
        "a root never sees it"
    );
    // A one-shot child answers from the parent's route.
    let run = start_run(&t.rt, "spawn", t.parent(), "one-shot work").await;
    within("the one-shot result", run.result()).await.unwrap();
    run.dispose().await.unwrap();
    assert!(
        !offers_report(&requests_of(&t.parent_model, run.id())[0]),
        "nor a one-shot"
    );
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    let request = requests_of(&t.child_model, child).remove(0);
    let granted: Vec<_> = request
        .tools
        .iter()
        .filter(|tool| tool.name == REPORT)
        .collect();
    assert_eq!(granted.len(), 1);
    assert_eq!(property_keys(&granted[0].parameters), ["output"]);
    assert_eq!(granted[0].parameters["required"], json!(["output"]));
    let description = &granted[0].description;
    assert!(
        description.contains("do not blindly repeat it"),
        "{description}"
    );
}

// TOOL-REPORT-02
#[actix_rt::test]
async fn without_the_installation_a_child_has_no_report_tool_and_a_call_is_unknown() {
    let t = Setup::new().await;
    t.child_model
        .push_all([report_call("r1", "CHILD_FINDING"), ScriptStep::text("done")]);
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    assert!(!offers_report(&requests_of(&t.child_model, child)[0]));
    let events = persisted(&t.rt, child).await;
    assert_eq!(
        tool_results(&events),
        [(true, format!("Error: unknown tool \"{REPORT}\""))]
    );
    assert_eq!(tool_error_codes(&events), [ErrorCode::UnknownTool.as_str()]);
    idle_after_turns(t.parent(), 1).await;
    assert!(reports_in(&t.parent().log().events()).is_empty());
}

// TOOL-REPORT-03
#[actix_rt::test]
async fn an_empty_allow_list_keeps_report_and_grants_no_control_tools() {
    let t = Setup::new().await;
    install_control_tools(&t.rt).unwrap().keep();
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let spec = child_spec(t.parent(), "filtered", "task")
        .tool_filter(ToolFilter::allow(Vec::<String>::new()));
    let filtered = start_spec(&t.rt, spec).await;
    settled(&t.recorder, filtered, 1).await;
    assert_eq!(
        tool_names(&requests_of(&t.child_model, filtered)[0]),
        [REPORT]
    );
    // Without the filter the same runtime offers the globals beside it.
    let plain = t.start_child("plain", "task").await;
    settled(&t.recorder, plain, 1).await;
    let names = tool_names(&requests_of(&t.child_model, plain)[0]);
    assert!(names.iter().any(|name| name == SEND_MESSAGE), "{names:?}");
    assert!(names.iter().any(|name| name == REPORT), "{names:?}");
}

// TOOL-REPORT-04
#[actix_rt::test]
async fn a_quiet_report_is_injected_without_waking_the_parent() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Quiet).keep();
    let hold = Gate::new();
    t.child_model.push_all([
        report_call("r1", "CHILD_FINDING"),
        ScriptStep::text("done").gated(&hold),
    ]);
    let child = t.start_child("child task", "task").await;
    hold.reached().await;
    let results = tool_results(&live(&t.rt, child).await.log().events());
    assert_eq!(results.len(), 1);
    let (is_error, accepted) = results[0].clone();
    assert!(!is_error && accepted.starts_with(ACCEPTED), "{accepted}");
    let status = t.parent().status().await.unwrap();
    assert_eq!(status.status, AgentStatus::Idle);
    assert_eq!(
        (status.next_step, status.next_turn),
        (1, 0),
        "steering context, not a turn"
    );
    assert_eq!(
        t.parent_model.request_count(),
        0,
        "the parent made no request"
    );
    assert_eq!(t.parent().log().last_turn(), 0);
    hold.release();
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await; // the notice's turn reads the injected report
    let reports = reports_in(&t.parent().log().events());
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].content, report_content(child, "CHILD_FINDING"));
    assert_eq!(
        reports[0].source,
        MessageSource::SubagentReportRelay {
            sender_session_id: child
        }
    );
    assert_eq!(accepted, format!("{ACCEPTED}{}", reports[0].id));
}

// TOOL-REPORT-05
#[actix_rt::test]
async fn a_wakeup_report_gives_an_idle_parent_one_new_turn() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let hold = Gate::new();
    t.child_model.push_all([
        report_call("r1", "HALFWAY"),
        ScriptStep::text("done").gated(&hold),
    ]);
    let child = t.start_child("child task", "task").await;
    hold.reached().await;
    idle_after_turns(t.parent(), 1).await;
    assert_eq!(t.parent().log().last_turn(), 1, "exactly one new turn");
    assert_eq!(t.parent_model.request_count(), 1);
    let events = t.parent().log().events();
    let reports = reports_in(&events);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].content, report_content(child, "HALFWAY"));
    assert_eq!(
        turn_of(&events, reports[0].id),
        Some(1),
        "it opened the turn"
    );
    let accepted = tool_results(&live(&t.rt, child).await.log().events()).remove(0);
    assert_eq!(accepted, (false, format!("{ACCEPTED}{}", reports[0].id)));
    hold.release();
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 2).await;
}

// TOOL-REPORT-06
#[actix_rt::test]
async fn repeated_reports_to_a_busy_parent_become_later_turns_in_order() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let busy = t.hold_parent().await;
    let hold = Gate::new();
    t.child_model.push_all([
        report_call("r1", "FIRST"),
        report_call("r2", "SECOND"),
        ScriptStep::text("done").gated(&hold),
    ]);
    let child = t.start_child("child task", "task").await;
    hold.reached().await;
    let status = t.parent().status().await.unwrap();
    assert_eq!(
        (status.next_turn, status.next_step),
        (2, 0),
        "next-turn FIFO, no step batch"
    );
    busy.release();
    idle_after_turns(t.parent(), 3).await;
    let events = t.parent().log().events();
    let reports = reports_in(&events);
    let outputs: Vec<String> = reports.iter().map(report_output).collect();
    assert_eq!(outputs, ["FIRST", "SECOND"]);
    assert_eq!(turn_of(&events, reports[0].id), Some(2));
    assert_eq!(turn_of(&events, reports[1].id), Some(3));
    hold.release();
    settled(&t.recorder, child, 1).await;
}

// TOOL-REPORT-07 TOOL-REPORT-08 (busy parent; seed-differences row 3: the notice may come
// first, and the accepted report outlives the child's release)
#[actix_rt::test]
async fn a_busy_parent_reads_the_notice_in_its_turn_and_the_surviving_report_after() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let busy = t.hold_parent().await;
    t.child_model.push_all([
        report_call("r1", "KEEP_ME"),
        ScriptStep::text("child final"),
    ]);
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    let status = status_until(t.parent(), "the notice to wait as a step", |s| {
        s.next_step == 1
    })
    .await;
    assert_eq!(
        status.next_turn, 1,
        "the report waits for a turn of its own"
    );
    released(&t.rt, child).await;
    assert_eq!(
        subagents::testing::resident_count(t.rt.subagents()).await,
        0
    );
    assert!(
        reports_in(&t.parent().log().events()).is_empty(),
        "not read yet"
    );
    busy.release();
    idle_after_turns(t.parent(), 2).await;
    let events = t.parent().log().events();
    let reports = reports_in(&events);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].content, report_content(child, "KEEP_ME"));
    let notice = notices_in(&events)[0].id;
    assert_eq!(
        turn_of(&events, notice),
        Some(1),
        "the notice joined the running turn"
    );
    assert_eq!(
        turn_of(&events, reports[0].id),
        Some(2),
        "the report is the next turn"
    );
}

// TOOL-REPORT-07 (idle parent: both are follow-ups, FIFO)
#[actix_rt::test]
async fn an_idle_parent_reads_the_report_before_the_settled_notice() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    t.child_model.push_all([
        report_call("r1", "FINDING"),
        ScriptStep::text("child final"),
    ]);
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    eventually("the notice", || {
        !notices_in(&t.parent().log().events()).is_empty()
    })
    .await;
    within("the parent", t.parent().when_idle()).await;
    let events = t.parent().log().events();
    let (reports, notices) = (reports_in(&events), notices_in(&events));
    assert_eq!((reports.len(), notices.len()), (1, 1));
    assert!(position_of(&events, reports[0].id) < position_of(&events, notices[0].id));
}

// TOOL-REPORT-09
#[actix_rt::test]
async fn a_grandchilds_report_reaches_its_parent_child_and_not_the_root() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let (child_gate, grand_hold) = (Gate::new(), Gate::new());
    t.child_model.push_all([
        ScriptStep::text("child works").gated(&child_gate),
        report_call("g1", "GRAND_FINDING"),
        ScriptStep::text("grand done").gated(&grand_hold),
    ]);
    let child = t.start_child("child task", "child work").await;
    child_gate.reached().await;
    let child_agent = live(&t.rt, child).await;
    let grand = start_spec(&t.rt, child_spec(&child_agent, "grand task", "grand work")).await;
    grand_hold.reached().await;
    let status = child_agent.status().await.unwrap();
    assert_eq!(
        (status.next_turn, status.next_step),
        (1, 0),
        "a later turn of the busy child"
    );
    assert_eq!(t.parent_model.request_count(), 0, "the root was not woken");
    child_gate.release();
    idle_after_turns(&child_agent, 2).await;
    let reports = reports_in(&child_agent.log().events());
    assert_eq!(reports.len(), 1);
    assert_eq!(
        reports[0].source,
        MessageSource::SubagentReportRelay {
            sender_session_id: grand
        }
    );
    assert_eq!(reports[0].content, report_content(grand, "GRAND_FINDING"));
    grand_hold.release();
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await;
    assert!(
        reports_in(&t.parent().log().events()).is_empty(),
        "exactly one edge upward"
    );
}

// TOOL-REPORT-10
#[actix_rt::test]
async fn a_parent_that_refuses_the_delivery_is_reported_as_parent_unavailable() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let t = Setup::on(faults.clone()).await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let gate = Gate::new();
    t.child_model.push_all([
        report_call("r1", "LOST").gated(&gate),
        ScriptStep::text("done"),
    ]);
    let child = t.start_child("child task", "task").await;
    gate.reached().await;
    // The parent's next write fails: it faults and refuses every later delivery.
    faults.arm_for(StoreOperation::Append, t.parent().id());
    t.parent()
        .followup(text("work"), MessageSource::User)
        .await
        .unwrap();
    status_until(t.parent(), "the parent to fault", |s| s.faulted).await;
    gate.release();
    settled(&t.recorder, child, 1).await;
    let events = persisted(&t.rt, child).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].0 && results[0].1.contains("rejected the followup/inject"),
        "{results:?}"
    );
    assert_eq!(
        tool_error_codes(&events),
        [ErrorCode::ParentUnavailable.as_str()]
    );
    assert!(
        reports_in(&t.parent().log().events()).is_empty(),
        "nothing was delivered"
    );
}

// TOOL-REPORT-11 (root, forged copy, cancellation)
#[actix_rt::test]
async fn report_from_refuses_a_root_a_stale_copy_and_a_cancelled_call() {
    let t = Setup::new().await;
    let (first, second) = (Gate::new(), Gate::new());
    t.child_model
        .push(ScriptStep::text("epoch one").gated(&first));
    let child = t.start_child("child task", "task").await;
    first.reached().await;
    let stale = live(&t.rt, child).await;
    first.release();
    settled(&t.recorder, child, 1).await;
    released(&t.rt, child).await;
    t.child_model
        .push(ScriptStep::text("epoch two").gated(&second));
    followup_child(&t.rt, t.parent(), child, "again")
        .await
        .unwrap();
    second.reached().await;
    let current = live(&t.rt, child).await;
    assert_ne!(current, stale, "a new Activation");
    let report = |agent: &AgentRef, options: ReportOptions| {
        t.rt.subagents()
            .report_from(agent, text("finding"), options)
    };
    let wakeup = || ReportOptions::new(ReportDelivery::Wakeup);
    let from_root = report(t.parent(), wakeup()).await.unwrap_err();
    assert_eq!(from_root.code(), ErrorCode::Unauthorized);
    let from_stale = report(&stale, wakeup()).await.unwrap_err();
    assert_eq!(from_stale.code(), ErrorCode::Unauthorized);
    let aborted = CancellationToken::new();
    aborted.cancel();
    let cancelled = report(&current, wakeup().cancel(aborted))
        .await
        .unwrap_err();
    assert_eq!(cancelled.code(), ErrorCode::Cancelled);
    report(&current, ReportOptions::new(ReportDelivery::Quiet))
        .await
        .expect("the exact resident child may report");
    second.release();
}

// TOOL-REPORT-11 TOOL-REPORT-17 (the parent is gone)
#[actix_rt::test]
async fn a_report_to_a_disposed_parent_is_an_error_result() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let gate = Gate::new();
    t.child_model.push_all([
        report_call("r1", "LATE").gated(&gate),
        ScriptStep::text("done"),
    ]);
    let child = t.start_child("child task", "task").await;
    gate.reached().await;
    t.parent.dispose().await.unwrap();
    gate.release();
    settled(&t.recorder, child, 1).await;
    let events = persisted(&t.rt, child).await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    assert!(
        results[0].0 && results[0].1.contains("not live"),
        "{results:?}"
    );
    assert_eq!(
        tool_error_codes(&events),
        [ErrorCode::ParentUnavailable.as_str()]
    );
}

// TOOL-REPORT-11 (drain)
#[actix_rt::test]
async fn a_report_during_a_drain_is_refused_as_draining() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let t = Setup::on(faults.clone()).await;
    let gate = Gate::new();
    t.child_model.push(ScriptStep::text("slow").gated(&gate));
    let child = t.start_child("child task", "task").await;
    gate.reached().await;
    let agent = live(&t.rt, child).await;
    // The drain stays under way while the child's teardown waits to release its lease.
    faults.hold(StoreOperation::ReleaseLease);
    let rt = t.rt.clone();
    let shutdown = tokio::spawn(async move { rt.shutdown().await });
    gate.release();
    within("a lease release to be held", faults.held_calls(1)).await;
    let options = ReportOptions::new(ReportDelivery::Wakeup);
    let refused =
        t.rt.subagents()
            .report_from(&agent, text("late"), options)
            .await;
    assert_eq!(refused.unwrap_err().code(), ErrorCode::Draining);
    faults.release(StoreOperation::ReleaseLease);
    within("shutdown", shutdown).await.unwrap().unwrap();
}

// TOOL-REPORT-12
#[actix_rt::test]
async fn removing_the_grant_revokes_the_resident_tool_and_a_new_grant_waits_for_the_next_activation(
) {
    let t = Setup::new().await;
    let (first, second) = (Gate::new(), Gate::new());
    t.child_model.push_all([
        report_call("r1", "TOO_LATE").gated(&first),
        ScriptStep::text("mid").gated(&second),
    ]);
    let grant = install_report_tool(&t.rt, ReportDelivery::Wakeup);
    let child = t.start_child("child task", "task").await;
    first.reached().await;
    grant.remove().unwrap();
    first.release();
    second.reached().await;
    let agent = live(&t.rt, child).await;
    let refused = (true, format!("Error: unknown tool \"{REPORT}\""));
    assert_eq!(
        tool_results(&agent.log().events()),
        [refused],
        "revoked even mid-turn"
    );
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    followup_child(&t.rt, t.parent(), child, "more")
        .await
        .unwrap();
    second.release();
    settled(&t.recorder, child, 1).await;
    let offered: Vec<bool> = requests_of(&t.child_model, child)
        .iter()
        .map(offers_report)
        .collect();
    assert_eq!(offered, [true, false, false], "no new grant while resident");
    followup_child(&t.rt, t.parent(), child, "again")
        .await
        .unwrap();
    settled(&t.recorder, child, 2).await;
    let requests = requests_of(&t.child_model, child);
    assert!(
        offers_report(requests.last().unwrap()),
        "the next Activation is granted"
    );
}

// TOOL-REPORT-12 (guidance). Expected to fail against src/tools/report.rs as drafted: its
// disposer revokes only the tool, so `tool:report` stays in a resident child's system prompt.
#[actix_rt::test]
async fn removing_the_grant_also_withdraws_the_guidance_from_resident_children() {
    let t = Setup::new().await;
    let gate = Gate::new();
    t.child_model.push(ScriptStep::text("one").gated(&gate));
    let grant = install_report_tool(&t.rt, ReportDelivery::Wakeup);
    let child = t.start_child("child task", "task").await;
    gate.reached().await;
    assert!(has_guidance(&requests_of(&t.child_model, child)[0]));
    followup_child(&t.rt, t.parent(), child, "more")
        .await
        .unwrap();
    grant.remove().unwrap();
    gate.release();
    settled(&t.recorder, child, 1).await;
    let requests = requests_of(&t.child_model, child);
    assert_eq!(requests.len(), 2);
    assert!(!offers_report(&requests[1]));
    assert!(
        !has_guidance(&requests[1]),
        "the section is revoked with the tool"
    );
}

// TOOL-REPORT-13 (adapted: the tool registration fails, so no child is built)
#[actix_rt::test]
async fn a_second_report_grant_refuses_the_start_and_leaves_nothing_behind() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    let duplicate = install_report_tool(&t.rt, ReportDelivery::Quiet);
    let refused =
        t.rt.subagents()
            .start_continuable(child_spec(t.parent(), "t", "task"))
            .await;
    assert_eq!(refused.unwrap_err().code(), ErrorCode::DuplicateTool);
    assert_eq!(
        t.rt.agents().list().await.len(),
        1,
        "only the parent exists"
    );
    assert_eq!(
        subagents::testing::resident_count(t.rt.subagents()).await,
        0
    );
    assert!(t.recorder.events().is_empty(), "nothing was announced");
    assert_eq!(t.child_model.request_count(), 0);
    duplicate.remove().unwrap();
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    let request = requests_of(&t.child_model, child).remove(0);
    assert_eq!(
        request
            .tools
            .iter()
            .filter(|tool| tool.name == REPORT)
            .count(),
        1
    );
    let system = request.system.clone().unwrap_or_default();
    assert_eq!(system.matches(GUIDANCE).count(), 1, "{system}");
}

// TOOL-REPORT-15
#[actix_rt::test]
async fn the_report_guidance_is_scoped_to_each_child() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    run_prompt(t.parent(), "hi").await;
    assert!(
        !has_guidance(&t.parent_model.requests()[0]),
        "not in the parent's assembly"
    );
    let first = t.start_child("first", "task").await;
    let second = t.start_child("second", "task").await;
    settled(&t.recorder, first, 1).await;
    settled(&t.recorder, second, 1).await;
    for child in [first, second] {
        let request = requests_of(&t.child_model, child).remove(0);
        assert!(has_guidance(&request) && offers_report(&request), "{child}");
        let system = request.system.clone().unwrap_or_default();
        assert!(system.contains("never ends your turn"), "{system}");
    }
}

// TOOL-REPORT-16
#[actix_rt::test]
async fn a_grant_revoked_while_a_child_is_built_rejects_the_start() {
    let t = Setup::new().await;
    let grant = Arc::new(Mutex::new(Some(install_report_tool(
        &t.rt,
        ReportDelivery::Wakeup,
    ))));
    let revoker = Arc::clone(&grant);
    // A later contribution revokes the report grant while the same child is being built.
    let contribution = move |_: &mut AgentScope| -> subagents::Result<SetupDisposer> {
        let taken = revoker.lock().unwrap().take();
        if let Some(registration) = taken {
            registration.remove()?;
        }
        Ok(Box::new(|| Ok(())) as SetupDisposer)
    };
    t.rt.subagents()
        .register_continuable_setup(Arc::new(contribution))
        .keep();
    let refused =
        t.rt.subagents()
            .start_continuable(child_spec(t.parent(), "t", "task"))
            .await;
    assert_eq!(
        refused.unwrap_err().code(),
        ErrorCode::ActivationSetupRevoked
    );
    assert_eq!(
        t.rt.agents().list().await.len(),
        1,
        "no agent is left behind"
    );
    assert_eq!(
        subagents::testing::resident_count(t.rt.subagents()).await,
        0
    );
    assert!(t.recorder.events().is_empty(), "no session was announced");
    assert_eq!(t.child_model.request_count(), 0);
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    assert!(
        !offers_report(&requests_of(&t.child_model, child)[0]),
        "the revocation stands"
    );
}

// TOOL-REPORT-18 (seed-differences row 2)
#[actix_rt::test]
async fn the_default_delivery_is_wakeup_and_every_other_value_is_refused() {
    assert_eq!(ReportDelivery::default(), ReportDelivery::Wakeup);
    assert_eq!(
        "wakeup".parse::<ReportDelivery>().unwrap(),
        ReportDelivery::Wakeup
    );
    assert_eq!(
        "quiet".parse::<ReportDelivery>().unwrap(),
        ReportDelivery::Quiet
    );
    for refused in ["next-step", "shout", "steer", "Wakeup", ""] {
        let error = refused.parse::<ReportDelivery>().unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidArgs, "{refused}");
        assert!(error.message().contains(&format!("`{refused}`")), "{error}");
    }
    assert!(serde_json::from_value::<ReportDelivery>(json!("next-step")).is_err());
    let parsed = serde_json::from_value::<ReportDelivery>(json!("wakeup")).unwrap();
    assert_eq!(parsed, ReportDelivery::Wakeup);
    // The default deployment wakes an idle parent into one new turn.
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::default()).keep();
    let hold = Gate::new();
    t.child_model.push_all([
        report_call("r1", "NEWS"),
        ScriptStep::text("done").gated(&hold),
    ]);
    let child = t.start_child("child task", "task").await;
    hold.reached().await;
    idle_after_turns(t.parent(), 1).await;
    assert_eq!(t.parent_model.request_count(), 1);
    assert_eq!(reports_in(&t.parent().log().events()).len(), 1);
    hold.release();
    settled(&t.recorder, child, 1).await;
}

// TOOL-REPORT-19
#[actix_rt::test]
async fn nothing_is_reported_automatically_when_a_child_finishes() {
    let t = Setup::new().await;
    install_report_tool(&t.rt, ReportDelivery::Wakeup).keep();
    t.child_model.push(ScriptStep::text("final answer"));
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await;
    assert!(
        offers_report(&requests_of(&t.child_model, child)[0]),
        "it could have reported"
    );
    let events = t.parent().log().events();
    assert!(reports_in(&events).is_empty(), "no automatic report");
    assert_eq!(notices_in(&events).len(), 1, "only the settled notice");
    assert!(tool_results(&persisted(&t.rt, child).await).is_empty());
}
