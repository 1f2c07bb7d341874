//! The global control tools (`send_message`, `interrupt_agent`, `list_agents`), ported from
//! providers-and-tools.md §2.2, driven through a calling agent's scripted model — or, where the
//! caller must be a child whose id is only minted at start, through `tools::execute`.
//!
//! The root parent and its continuable children answer from two separate scripted models
//! (routes `scripted` and `child`), so a child's requests never consume the parent's script.
//!
//! Nothing is skipped. Adapted:
//! - TOOL-CTRL-06: a `ToolCtx` always names a session, so "no calling agent" is a call whose
//!   session is not a live agent (`NO_CALLING_AGENT`), run through `tools::execute`.
//! - TOOL-CTRL-09: the service's `cancel({kind:parent},{keepInbox:true})` cannot be spied on;
//!   it is observed as the child's turn ending `aborted(parent)` with its queue parked.
//! - TOOL-CTRL-15: `Subagents` is concrete and cannot be stubbed; the same row shapes are built
//!   from stored (authored) sessions and live children.
//! - TOOL-CTRL-16: which listing method ran (and the forwarded signal) cannot be spied on; the
//!   scope is observed through what is listed.

use std::sync::Arc;

use serde_json::{json, Value};
use subagents::session::SessionOrigin;
use subagents::testing::{FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::tools::{
    execute, ToolExecutionResult, ToolLayer, INTERRUPT_AGENT, LIST_AGENTS, NO_CALLING_AGENT,
    SEND_MESSAGE,
};
use subagents::{
    install_control_tools, CallId, CancelCause, CancellationToken, ContentBlock, ErrorCode,
    EventKind, MemoryStore, Message, MessageSource, Runtime, SessionEvent, SessionHeader,
    SessionId, SessionPersistence, SubagentDescriptor, SubagentEvent, ToolCtx, TurnEndReason,
};

use crate::support::{
    author, delivered, eventually, idle_after_turns, live, persisted, property_keys, released,
    root, run_prompt, seam_runtime, settled, start_run, start_under, tool_results, turn_ends,
    within, Routed,
};

mod fixture;
use fixture::*;

// TOOL-CTRL-01
#[actix_rt::test]
async fn send_message_is_registered_once_with_next_turn_wording_and_no_job_wording() {
    let t = Setup::new().await;
    let duplicate = install_control_tools(&t.rt).unwrap_err();
    assert_eq!(duplicate.code(), ErrorCode::DuplicateTool);
    let names = global_names(&t.rt);
    assert_eq!(names.iter().filter(|name| *name == SEND_MESSAGE).count(), 1);
    let schema = global_schema(&t.rt, SEND_MESSAGE);
    assert_eq!(
        property_keys(&schema.parameters),
        ["message", "subagent_id"]
    );
    assert_eq!(
        schema.parameters["required"],
        json!(["subagent_id", "message"])
    );
    let description = &schema.description;
    assert!(description.contains("next turn"), "{description}");
    assert!(description.contains("NOT delivered"), "{description}");
    assert!(!description.contains("job"), "{description}");
}

// TOOL-CTRL-02
#[actix_rt::test]
async fn send_message_cold_resumes_a_settled_child_and_confirms_the_queued_turn() {
    let t = Setup::new().await;
    let child = t.start_child("child task", "first task").await;
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await; // the settled notice's turn
    released(&t.rt, child).await;
    let results = t.run_parent([send("c1", child, "continue please")]).await;
    assert_eq!(results, [(false, queued_line(child))]);
    settled(&t.recorder, child, 2).await;
    let events = persisted(&t.rt, child).await;
    assert_eq!(delivered(&events), ["first task", "continue please"]);
    let relayed = last_user_message(&events);
    let pid = t.parent().id();
    assert_eq!(
        relayed.source,
        MessageSource::CoordinatorRelay {
            sender_session_id: pid
        }
    );
    assert_eq!(
        serde_json::to_value(&relayed.source).unwrap(),
        json!({"kind": "coordinator", "form": "relay", "senderSessionId": pid})
    );
}

// TOOL-CTRL-03
#[actix_rt::test]
async fn send_message_queues_behind_an_open_turn_instead_of_joining_it() {
    let t = Setup::new().await;
    let gate = Gate::new();
    t.child_model.push(ScriptStep::text("working").gated(&gate));
    let child = t.start_child("child task", "long work").await;
    gate.reached().await;
    let results = t.run_parent([send("c1", child, "also consider Y")]).await;
    assert_eq!(results, [(false, queued_line(child))]);
    let status = live(&t.rt, child).await.status().await.unwrap();
    assert_eq!(status.turn, Some(1), "the open turn is still the first");
    assert_eq!(
        status.next_turn, 1,
        "the message waits for a turn of its own"
    );
    assert_eq!(status.next_step, 0, "it does not join the running turn");
    gate.release();
    settled(&t.recorder, child, 1).await;
    let events = persisted(&t.rt, child).await;
    assert_eq!(delivered(&events), ["long work", "also consider Y"]);
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
}

// TOOL-CTRL-04
#[actix_rt::test]
async fn send_message_to_an_unknown_subagent_is_an_error_result() {
    let t = Setup::new().await;
    let junk = ScriptStep::tool_call(
        "c2",
        SEND_MESSAGE,
        json!({"subagent_id": "not-a-subagent-id", "message": "hello"}),
    );
    let results = t
        .run_parent([send("c1", SessionId::new(), "hello"), junk])
        .await;
    assert_eq!(results.len(), 2);
    for (is_error, text) in &results {
        assert!(*is_error, "{text}");
        assert!(
            text.starts_with("Error: ") && text.contains("unavailable"),
            "{text}"
        );
    }
    assert_eq!(t.child_model.request_count(), 0, "nothing was resumed");
}

// TOOL-CTRL-05
#[actix_rt::test]
async fn send_message_from_a_caller_that_is_not_the_durable_parent_is_refused() {
    let t = Setup::new().await;
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await;
    let requests = t.child_model.request_count();
    let stranger = root(&t.rt).await;
    let from = stranger.agent().log().len();
    t.parent_model
        .push_all([send("c1", child, "hijack"), ScriptStep::text("done")]);
    run_prompt(stranger.agent(), "go").await;
    let results = tool_results(&stranger.agent().log().events_from(from));
    assert_eq!(results.len(), 1);
    assert!(
        results[0].0 && results[0].1.contains("another parent session"),
        "{results:?}"
    );
    assert_eq!(
        t.child_model.request_count(),
        requests,
        "the child never ran"
    );
    assert!(!delivered(&persisted(&t.rt, child).await).contains(&"hijack".to_owned()));
}

// TOOL-CTRL-06
#[actix_rt::test]
async fn every_control_tool_fails_loud_without_a_live_calling_agent() {
    let t = Setup::new().await;
    let gone = root(&t.rt).await;
    let caller = gone.agent().id();
    gone.dispose().await.unwrap();
    let target = SessionId::new().to_string();
    for (tool, args) in [
        (
            SEND_MESSAGE,
            json!({"subagent_id": target, "message": "hi"}),
        ),
        (INTERRUPT_AGENT, json!({"agent_id": target})),
        (LIST_AGENTS, json!({})),
    ] {
        let result = call_direct(&t.rt, caller, tool, args).await;
        assert!(result.is_error, "{tool}");
        assert_eq!(result.error.as_ref().unwrap().code, NO_CALLING_AGENT);
        let text = result_text(&result);
        let expected = format!("Error: {tool} requires a calling agent");
        assert!(text.starts_with(&expected), "{text}");
    }
}

// TOOL-CTRL-07
#[actix_rt::test]
async fn removing_the_installation_unregisters_all_three_tools() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let control = [SEND_MESSAGE, INTERRUPT_AGENT, LIST_AGENTS].map(str::to_owned);
    let installed = install_control_tools(&rt).unwrap();
    assert!(control.iter().all(|name| global_names(&rt).contains(name)));
    installed.remove();
    assert!(control.iter().all(|name| !global_names(&rt).contains(name)));
    let refused = call_direct(&rt, parent.agent().id(), LIST_AGENTS, json!({})).await;
    assert!(refused.is_error);
    assert_eq!(refused.error.unwrap().code, ErrorCode::UnknownTool.as_str());
    // Dropping an installation unregisters too; the names are free again afterwards.
    {
        let _again = install_control_tools(&rt).expect("the names were released");
        assert!(control.iter().all(|name| global_names(&rt).contains(name)));
    }
    assert!(control.iter().all(|name| !global_names(&rt).contains(name)));
    run_prompt(parent.agent(), "hi").await;
    let offered: Vec<String> = model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert!(
        control.iter().all(|name| !offered.contains(name)),
        "{offered:?}"
    );
}

// TOOL-CTRL-08
#[actix_rt::test]
async fn interrupt_agent_takes_only_an_agent_id_and_explains_the_current_turn_rule() {
    let t = Setup::new().await;
    let schema = global_schema(&t.rt, INTERRUPT_AGENT);
    assert_eq!(property_keys(&schema.parameters), ["agent_id"]);
    assert_eq!(schema.parameters["required"], json!(["agent_id"]));
    assert!(
        schema.description.contains("current turn"),
        "{}",
        schema.description
    );
    assert!(
        schema.description.contains("send_message"),
        "{}",
        schema.description
    );
}

// TOOL-CTRL-09
#[actix_rt::test]
async fn interrupt_agent_stops_a_running_childs_turn_and_parks_its_queue() {
    let t = Setup::new().await;
    let gate = Gate::new();
    t.child_model.push(ScriptStep::text("working").gated(&gate));
    let child = t.start_child("child task", "long work").await;
    gate.reached().await;
    let results = t
        .run_parent([
            send("c1", child, "parked follow-up"),
            interrupt("c2", child),
        ])
        .await;
    assert_eq!(
        results,
        [
            (false, queued_line(child)),
            (false, interrupted_line(child))
        ]
    );
    let agent = live(&t.rt, child).await;
    within("the interrupted turn", agent.when_idle()).await;
    let status = agent.status().await.unwrap();
    assert!(status.parked, "the queue is parked, not run");
    assert_eq!(status.next_turn, 1);
    assert_eq!(
        t.child_model.request_count(),
        1,
        "no request after the interrupt"
    );
    assert!(
        t.rt.agents().get(child).await.is_some(),
        "the target stays available"
    );
    let results = t.run_parent([send("c3", child, "wake up")]).await;
    assert_eq!(results, [(false, queued_line(child))]);
    settled(&t.recorder, child, 1).await;
    let events = persisted(&t.rt, child).await;
    assert_eq!(
        delivered(&events),
        ["long work", "parked follow-up", "wake up"]
    );
    let aborted = TurnEndReason::Aborted {
        reason: CancelCause::Parent,
    };
    assert_eq!(
        turn_ends(&events),
        [aborted, TurnEndReason::Completed, TurnEndReason::Completed]
    );
}

// TOOL-CTRL-10
#[actix_rt::test]
async fn a_live_ancestor_may_interrupt_its_grandchild() {
    let t = Setup::new().await;
    let (child_gate, grand_gate) = (Gate::new(), Gate::new());
    t.child_model.push_all([
        ScriptStep::text("child works").gated(&child_gate),
        ScriptStep::text("grandchild works").gated(&grand_gate),
    ]);
    let child = t.start_child("child task", "child work").await;
    child_gate.reached().await;
    let child_agent = live(&t.rt, child).await;
    let grand = start_under(&t.rt, &child_agent, "grandchild task", "grand work").await;
    grand_gate.reached().await;
    let grand_agent = live(&t.rt, grand).await;
    let results = t.run_parent([interrupt("c1", grand)]).await;
    assert_eq!(results, [(false, interrupted_line(grand))]);
    eventually("the grandchild's turn to end", || {
        !turn_ends(&grand_agent.log().events()).is_empty()
    })
    .await;
    assert_eq!(
        turn_ends(&grand_agent.log().events()),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
    assert_eq!(
        child_agent.status().await.unwrap().turn,
        Some(1),
        "the child runs on"
    );
    child_gate.release();
    settled(&t.recorder, child, 1).await;
    assert_eq!(
        turn_ends(&persisted(&t.rt, child).await)[0],
        TurnEndReason::Completed
    );
}

// TOOL-CTRL-11
#[actix_rt::test]
async fn interrupt_agent_refuses_self_sibling_and_stranger_callers() {
    let t = Setup::new().await;
    let (sibling_gate, target_gate) = (Gate::new(), Gate::new());
    t.child_model.push_all([
        ScriptStep::text("sibling").gated(&sibling_gate),
        ScriptStep::text("target").gated(&target_gate),
    ]);
    let sibling = t.start_child("sibling", "sibling work").await;
    sibling_gate.reached().await;
    let target = t.start_child("target", "target work").await;
    target_gate.reached().await;
    let stranger = root(&t.rt).await;
    let args = json!({"agent_id": target.to_string()});
    for (caller, expected) in [
        (target, "cannot interrupt itself"),
        (sibling, "not a live descendant"),
        (stranger.agent().id(), "not a live descendant"),
    ] {
        let result = call_direct(&t.rt, caller, INTERRUPT_AGENT, args.clone()).await;
        assert!(result.is_error);
        assert_eq!(
            result.error.as_ref().unwrap().code,
            ErrorCode::Unauthorized.as_str()
        );
        let text = result_text(&result);
        assert!(
            text.starts_with("Error: ") && text.contains(expected),
            "{text}"
        );
    }
    let status = live(&t.rt, target).await.status().await.unwrap();
    assert_eq!(status.turn, Some(1), "the target was never cancelled");
    target_gate.release();
    sibling_gate.release();
    settled(&t.recorder, target, 1).await;
    assert_eq!(
        turn_ends(&persisted(&t.rt, target).await),
        [TurnEndReason::Completed]
    );
}

// TOOL-CTRL-12
#[actix_rt::test]
async fn interrupting_a_settled_or_unknown_agent_is_an_accepted_no_op_without_resume() {
    let t = Setup::new().await;
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await;
    released(&t.rt, child).await;
    let requests = t.child_model.request_count();
    let unknown = SessionId::new();
    let results = t
        .run_parent([interrupt("c1", child), interrupt("c2", unknown)])
        .await;
    assert_eq!(
        results,
        [
            (false, interrupted_line(child)),
            (false, interrupted_line(unknown))
        ]
    );
    assert!(t.rt.agents().get(child).await.is_none(), "not cold-resumed");
    assert_eq!(t.child_model.request_count(), requests);
    let starts = t
        .recorder
        .events()
        .iter()
        .filter(|event| matches!(event, SubagentEvent::Start(info) if info.id == child))
        .count();
    assert_eq!(starts, 1, "no new epoch");
    assert_eq!(
        subagents::testing::resident_count(t.rt.subagents()).await,
        0
    );
}

// TOOL-CTRL-13 TOOL-CTRL-18
#[actix_rt::test]
async fn list_agents_takes_an_optional_scope_and_describes_the_status_vocabulary() {
    let t = Setup::new().await;
    let schema = global_schema(&t.rt, LIST_AGENTS);
    assert_eq!(property_keys(&schema.parameters), ["scope"]);
    let scope = &schema.parameters["properties"]["scope"];
    assert_eq!(scope["enum"], json!(["children", "descendants"]));
    let required = schema.parameters.get("required");
    assert!(
        required.is_none() || required == Some(&json!([])),
        "{required:?}"
    );
    let description = &schema.description;
    for phrase in [
        "send_message",
        "interrupt_agent",
        "you are told when one finishes",
        "resumable, not terminal",
    ] {
        assert!(description.contains(phrase), "{phrase}: {description}");
    }
    let at = |word: &str| description.find(word).unwrap_or_else(|| panic!("{word}"));
    assert!(
        at("running") < at("idle") && at("idle") < at("ready"),
        "{description}"
    );
}

// TOOL-CTRL-14
#[actix_rt::test]
async fn list_agents_without_children_says_so() {
    let t = Setup::new().await;
    let results = t.run_parent([list("c1", json!({}))]).await;
    assert_eq!(results, [(false, "(no subagents)".to_owned())]);
}

// TOOL-CTRL-15
#[actix_rt::test]
async fn list_agents_renders_ready_running_idle_and_diagnostic_rows_and_drops_one_shots() {
    let store = Arc::new(MemoryStore::new());
    let t = Setup::on(store.clone()).await;
    let pid = t.parent().id();
    let ready = author(
        &*store,
        delegated(pid, 1),
        settled_log(continuable("real child")),
    )
    .await;
    author(
        &*store,
        delegated(pid, 2),
        settled_log(one_shot("one-shot child")),
    )
    .await;
    let malformed = json!({"version": 2, "mode": "continuable", "provider": 7});
    let broken = author(&*store, delegated(pid, 3), settled_log(malformed)).await;
    let (running_gate, waiting_gate, leaf_gate) = (Gate::new(), Gate::new(), Gate::new());
    t.child_model.push_all([
        ScriptStep::text("still at it").gated(&running_gate),
        ScriptStep::text("delegated").gated(&waiting_gate),
        ScriptStep::text("leaf").gated(&leaf_gate),
    ]);
    let running = t.start_child("still working", "work").await;
    running_gate.reached().await;
    let waiting = t.start_child("waiting on descendants", "delegate").await;
    waiting_gate.reached().await;
    let waiting_agent = live(&t.rt, waiting).await;
    start_under(&t.rt, &waiting_agent, "leaf", "leaf work").await;
    leaf_gate.reached().await;
    waiting_gate.release();
    within("the waiting child's turn", waiting_agent.when_idle()).await;

    let results = t.run_parent([list("c1", json!({}))]).await;
    assert_eq!(results.len(), 1);
    assert!(!results[0].0, "{}", results[0].1);
    let lines: Vec<&str> = results[0].1.lines().collect();
    assert_eq!(lines.len(), 4, "the one-shot row is dropped: {lines:?}");
    // Stored rows come first (older createdAt); the two live ones may share a millisecond.
    assert_eq!(lines[0], format!("{ready} [ready] — real child"));
    assert_eq!(lines[1], format!("{broken} [diagnostic: corrupt]"));
    let mut live_rows = lines[2..].to_vec();
    live_rows.sort_unstable();
    let mut expected = vec![
        format!("{running} [running] — still working"),
        format!("{waiting} [idle] — waiting on descendants"),
    ];
    expected.sort_unstable();
    assert_eq!(live_rows, expected);
}

// TOOL-CTRL-16 TOOL-CTRL-19
#[actix_rt::test]
async fn list_agents_scopes_to_children_by_default_and_positions_descendants() {
    let t = Setup::new().await;
    let (child_gate, leaf_gate) = (Gate::new(), Gate::new());
    t.child_model.push_all([
        ScriptStep::text("delegated").gated(&child_gate),
        ScriptStep::text("leaf").gated(&leaf_gate),
    ]);
    let child = t.start_child("waiting branch", "branch work").await;
    child_gate.reached().await;
    let child_agent = live(&t.rt, child).await;
    let grand = start_under(&t.rt, &child_agent, "nested leaf", "leaf work").await;
    leaf_gate.reached().await;
    child_gate.release();
    within("the child's turn", child_agent.when_idle()).await;

    let pid = t.parent().id();
    let results = t
        .run_parent([ScriptStep::tool_calls(&[
            ("c1", LIST_AGENTS, json!({})),
            ("c2", LIST_AGENTS, json!({"scope": "children"})),
            ("c3", LIST_AGENTS, json!({"scope": "descendants"})),
            ("c4", LIST_AGENTS, json!({"scope": "everything"})),
        ])])
        .await;
    let children_only = format!("{child} [idle] — waiting branch");
    assert_eq!(
        results[0],
        (false, children_only.clone()),
        "children is the default"
    );
    assert_eq!(results[1], (false, children_only));
    let tree = format!(
        "{child} [idle] parent={pid} depth=1 — waiting branch\n\
         {grand} [running] parent={child} depth=2 — nested leaf"
    );
    assert_eq!(results[2], (false, tree));
    assert!(
        results[3].0 && results[3].1.contains("scope"),
        "{:?}",
        results[3]
    );
    leaf_gate.release();
}

// TOOL-CTRL-17
#[actix_rt::test]
async fn a_settled_continuable_child_is_ready_and_a_one_shot_sibling_is_omitted() {
    let t = Setup::new().await;
    let child = t.start_child("child task", "task").await;
    settled(&t.recorder, child, 1).await;
    idle_after_turns(t.parent(), 1).await;
    released(&t.rt, child).await;
    // A one-shot child answers from the parent's route (it inherits the parent's options).
    let run = start_run(&t.rt, "spawn", t.parent(), "one-shot work").await;
    within("the one-shot result", run.result()).await.unwrap();
    run.dispose().await.unwrap();
    let listed =
        t.rt.subagents()
            .list_children(t.parent().id(), CancellationToken::new())
            .await
            .unwrap();
    assert_eq!(listed.len(), 2, "the service lists both children");
    let results = t.run_parent([list("c1", json!({}))]).await;
    assert_eq!(results, [(false, format!("{child} [ready] — child task"))]);
}

// TOOL-CTRL-20
#[actix_rt::test]
async fn a_one_shot_intermediate_is_omitted_while_its_leaf_and_a_diagnostic_keep_their_place() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let t = Setup::on(faults.clone()).await;
    let pid = t.parent().id();
    let mid = author(
        &*faults,
        delegated(pid, 1),
        settled_log(one_shot("one-shot mid")),
    )
    .await;
    let leaf = author(
        &*faults,
        delegated(mid, 2),
        settled_log(continuable("deep leaf")),
    )
    .await;
    let broken = author(
        &*faults,
        delegated(pid, 3),
        settled_log(continuable("broken")),
    )
    .await;
    faults.arm_for(StoreOperation::Inspect, broken);
    let results = t
        .run_parent([list("c1", json!({"scope": "descendants"}))])
        .await;
    let tree = format!(
        "{leaf} [ready] parent={mid} depth=2 — deep leaf\n\
         {broken} [diagnostic: unavailable] parent={pid} depth=1"
    );
    assert_eq!(results, [(false, tree)]);
}
