//! Structured output: the schema subset, the capture tool, its guard and commit, and how a
//! structured run settles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use subagents::schema::{assert_object_json_schema, ObjectSchema};
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::tools::structured_output::STRUCTURED_OUTPUT_INSTRUCTION;
use subagents::tools::{PostExecuteHook, PreToolDecision, ToolExecutionResult};
use subagents::{
    AgentEvent, AgentEventKind, ContentBlock, ErrorCode, EventKind, EventScope, PromptSection,
    Runtime, StopReason, SubagentStartRequest, Tool, ToolOutput,
};
use tokio_util::sync::CancellationToken;

use crate::support::{root, run_prompt, seam_runtime, seam_runtime_from, text, tool_error_codes};

fn answer_schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "number"}, "note": {"type": "string"}}, "required": ["answer"]})
}

fn capture(args: Value) -> ScriptStep {
    ScriptStep::tool_call("c1", "structured_output", args)
}

async fn structured_run(
    rt: &Runtime,
    schema: Value,
) -> (subagents::AgentHandle, subagents::SubagentRun) {
    let parent = root(rt).await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("compute")).output_schema(schema),
        )
        .await
        .expect("the structured run starts");
    (parent, run)
}

fn results(run: &subagents::SubagentRun) -> Vec<(bool, String)> {
    run.local_agent()
        .unwrap()
        .log()
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { message, .. } => match &message.content[0] {
                ContentBlock::ToolResult {
                    content, is_error, ..
                } => Some((
                    *is_error,
                    content.iter().filter_map(ContentBlock::as_text).collect(),
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

// STRUCT-01 STRUCT-02 SPAWN-19
#[actix_rt::test]
async fn a_valid_capture_completes_the_run_without_another_model_step() {
    let model = ScriptedModel::with_script([
        capture(json!({"answer": 42, "note": "done"})),
        ScriptStep::text("never"),
    ]);
    let rt = seam_runtime(&model).await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(
        result.structured,
        Some(json!({"answer": 42, "note": "done"}))
    );
    assert_eq!(model.request_count(), 1, "the capture concluded the turn");
    assert_eq!(
        results(&run),
        [(false, "Structured output recorded.".to_owned())]
    );
    run.dispose().await.unwrap();
    assert!(
        !rt.tools().unregister("structured_output"),
        "nothing global was registered"
    );
}

fn side_effect_tool(ran: &Arc<AtomicBool>) -> Tool {
    let ran = Arc::clone(ran);
    Tool::new("side_effect", "", json!({"type": "object"}), move |_, _| {
        ran.store(true, Ordering::SeqCst);
        async { Ok(ToolOutput::text("side effect")) }
    })
}

/// A runtime whose model captures, then calls `side_effect` in the same response.
async fn capture_then_side_effect(ran: &Arc<AtomicBool>) -> Runtime {
    let model = ScriptedModel::with_script([ScriptStep::tool_calls(&[
        ("c1", "structured_output", json!({"answer": 5})),
        ("c2", "side_effect", json!({})),
    ])]);
    seam_runtime_from(
        Runtime::builder()
            .model("scripted", model)
            .tool(side_effect_tool(ran)),
    )
    .await
}

// STRUCT-03
#[actix_rt::test]
async fn calls_after_the_capture_in_the_same_response_never_run() {
    let ran = Arc::new(AtomicBool::new(false));
    let rt = capture_then_side_effect(&ran).await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Completed, Some(json!({"answer": 5})))
    );
    assert!(!ran.load(Ordering::SeqCst), "the side effect never ran");
    let outcome = results(&run);
    assert!(
        outcome[1].0 && outcome[1].1.contains("structured output already recorded"),
        "{outcome:?}"
    );
    run.dispose().await.unwrap();
}

// STRUCT-04
#[actix_rt::test]
async fn a_later_prepended_pre_execute_listener_cannot_resurrect_dispatch_after_capture() {
    let ran = Arc::new(AtomicBool::new(false));
    let rt = capture_then_side_effect(&ran).await;
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    // The outermost listener consults the rest, then allows whatever they said.
    rt.tools().pre_execute_first(Arc::new(move |_, next| {
        counter.fetch_add(1, Ordering::SeqCst);
        let _ = next();
        PreToolDecision::Allow
    }));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 5})));
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the listener saw both calls"
    );
    assert!(!ran.load(Ordering::SeqCst), "the side effect never ran");
    let outcome = results(&run);
    assert!(outcome[1].0, "its tool result is an error: {outcome:?}");
    run.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_pre_execute_listener_can_deny_and_an_ask_without_approval_is_refused() {
    let ran = Arc::new(AtomicBool::new(false));
    let model = ScriptedModel::with_script([
        ScriptStep::tool_calls(&[
            ("c1", "side_effect", json!({})),
            ("c2", "side_effect", json!({"ask": true})),
        ]),
        ScriptStep::text("done"),
    ]);
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model)
            .tool(side_effect_tool(&ran)),
    )
    .await;
    rt.tools().pre_execute(Arc::new(|call, next| {
        if call.arguments.get("ask").is_some() {
            PreToolDecision::Ask {
                reason: Some("writes".into()),
            }
        } else {
            match next() {
                PreToolDecision::Allow => PreToolDecision::Deny {
                    reason: "not today".into(),
                },
                other => other,
            }
        }
    }));
    let parent = root(&rt).await;
    let events = run_prompt(parent.agent(), "go").await;
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(tool_error_codes(&events), ["TOOL_DENIED", "TOOL_DENIED"]);
    parent.dispose().await.unwrap();
}

// STRUCT-05
#[actix_rt::test]
async fn calls_before_the_capture_in_the_same_response_run() {
    let ran = Arc::new(AtomicBool::new(false));
    let model = ScriptedModel::with_script([ScriptStep::tool_calls(&[
        ("c1", "side_effect", json!({})),
        ("c2", "structured_output", json!({"answer": 6})),
    ])]);
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model)
            .tool(side_effect_tool(&ran)),
    )
    .await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    assert_eq!(
        run.result().await.unwrap().structured,
        Some(json!({"answer": 6}))
    );
    assert!(ran.load(Ordering::SeqCst));
    run.dispose().await.unwrap();
}

// STRUCT-06
#[actix_rt::test]
async fn an_invalid_capture_is_an_error_result_and_the_model_retries_in_turn() {
    let model = ScriptedModel::with_script([
        capture(json!({"answer": "not-a-number"})),
        capture(json!({"answer": 7})),
    ]);
    let rt = seam_runtime(&model).await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Completed, Some(json!({"answer": 7})))
    );
    assert_eq!(
        tool_error_codes(&run.local_agent().unwrap().log().events()),
        ["INVALID_ARGS"]
    );
    assert_eq!(results(&run).len(), 2);
    run.dispose().await.unwrap();
}

// STRUCT-07
#[actix_rt::test]
async fn a_clean_finish_without_a_capture_is_an_error_with_no_reprompt() {
    let model = ScriptedModel::with_script([ScriptStep::text("the answer is 3")]);
    let rt = seam_runtime(&model).await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Error, None)
    );
    assert_eq!(model.request_count(), 1);
    let log = run.local_agent().unwrap().log().events();
    let own_messages = log
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::UserMessage(m) if !matches!(m.source, subagents::MessageSource::Plugin { .. })))
        .count();
    assert_eq!(own_messages, 1, "no nudge message");
    run.dispose().await.unwrap();
}

// STRUCT-08
#[actix_rt::test]
async fn an_errored_child_keeps_its_error() {
    let model = ScriptedModel::with_script([ScriptStep::fail("BOOM", "model down")]);
    let rt = seam_runtime(&model).await;
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Error);
    assert_eq!(model.request_count(), 1);
    run.dispose().await.unwrap();
}

// STRUCT-09
#[actix_rt::test]
async fn a_cancel_after_a_clean_capture_less_turn_settles_aborted() {
    let model = ScriptedModel::with_script([ScriptStep::text("prose")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let token = CancellationToken::new();
    let fire = token.clone();
    let parent_id = parent.agent().id();
    let _sub = rt
        .events()
        .subscribe(EventScope::All, move |e: &AgentEvent| {
            if e.agent != parent_id && matches!(e.kind, AgentEventKind::TurnEnded { .. }) {
                fire.cancel();
            }
        });
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x"))
                .output_schema(answer_schema())
                .cancel(token),
        )
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
}

// STRUCT-10 STRUCT-11
#[actix_rt::test]
async fn schemas_outside_the_subset_fail_before_any_child_exists() {
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let parent = root(&rt).await;
    for schema in [
        json!({"type": "object", "oneOf": []}),
        json!({"type": "object", "default": {"x": -0.0}}),
    ] {
        let error = rt
            .subagents()
            .start(
                "spawn",
                SubagentStartRequest::new(parent.agent(), text("x")).output_schema(schema),
            )
            .await
            .unwrap_err();
        assert_eq!(error.code(), ErrorCode::UnsupportedSchema);
        assert!(error.message().starts_with("unsupported JSON schema"));
    }
    let lossy = subagents::ObjectSchema::new(json!({"type": "object", "default": {"x": -0.0}}))
        .unwrap_err();
    assert!(lossy
        .message()
        .contains("annotation must be lossless JSON data"));
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent exists");
}

fn blocking_hook(first_only: bool) -> PostExecuteHook {
    let fired = Arc::new(AtomicBool::new(false));
    Arc::new(move |call, result: ToolExecutionResult| {
        if call.name == "structured_output" && !(first_only && fired.swap(true, Ordering::SeqCst)) {
            ToolExecutionResult::failure(call.name, "BLOCKED", "blocked by policy: explain first")
        } else {
            result
        }
    })
}

// STRUCT-12
#[actix_rt::test]
async fn a_post_execute_block_denies_the_capture() {
    let model =
        ScriptedModel::with_script([capture(json!({"answer": 1})), ScriptStep::text("gave up")]);
    let rt = seam_runtime(&model).await;
    rt.tools().post_execute(blocking_hook(false));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Error, None)
    );
    assert_eq!(
        results(&run),
        [(true, "Error: blocked by policy: explain first".to_owned())]
    );
    assert_eq!(
        model.request_count(),
        2,
        "the blocked capture did not end the turn"
    );
    run.dispose().await.unwrap();
}

// STRUCT-13
#[actix_rt::test]
async fn a_post_execute_replacement_still_commits() {
    let model = ScriptedModel::with_script([capture(json!({"answer": 8}))]);
    let rt = seam_runtime(&model).await;
    rt.tools()
        .post_execute(Arc::new(|_, mut result: ToolExecutionResult| {
            result.content = text("rewritten");
            result
        }));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Completed, Some(json!({"answer": 8})))
    );
    assert_eq!(results(&run), [(false, "rewritten".to_owned())]);
    run.dispose().await.unwrap();
}

// STRUCT-14
#[actix_rt::test]
async fn the_last_post_execute_hook_is_authoritative() {
    let model =
        ScriptedModel::with_script([capture(json!({"answer": 1})), ScriptStep::text("gave up")]);
    let rt = seam_runtime(&model).await;
    rt.tools().post_execute(Arc::new(|_, result| result));
    rt.tools().post_execute(blocking_hook(false));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    assert_eq!(run.result().await.unwrap().structured, None);
    assert!(results(&run)[0].0);
    run.dispose().await.unwrap();
}

// STRUCT-15 STRUCT-19 STRUCT-23
#[actix_rt::test]
async fn the_instruction_rides_only_the_structured_child_request_in_its_order() {
    let model =
        ScriptedModel::with_script([ScriptStep::text("parent"), capture(json!({"answer": 1}))]);
    let builder = Runtime::builder()
        .model("scripted", model.clone())
        .prompt_section(PromptSection::new("base", 10.0, "You are a counter."))
        .prompt_section(PromptSection::new("late", 200.0, "Late section."))
        .tool(Tool::new("zz_probe", "", json!({}), |_, _| async {
            Ok(ToolOutput::default())
        }));
    let rt = seam_runtime_from(builder).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "hi").await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).output_schema(answer_schema()),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let requests = model.requests();
    let parent_system = requests[0].system.clone().unwrap();
    let child_system = requests[1].system.clone().unwrap();
    assert!(!parent_system.contains(STRUCTURED_OUTPUT_INSTRUCTION));
    assert!(
        child_system.starts_with("You are a counter."),
        "the base prompt is kept first"
    );
    assert!(
        child_system.ends_with(&format!("{STRUCTURED_OUTPUT_INSTRUCTION}\n\nLate section.")),
        "{child_system}"
    );
    let names: Vec<_> = requests[1].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["structured_output", "zz_probe"],
        "tools are name-sorted"
    );
    run.dispose().await.unwrap();
}

// STRUCT-20 STRUCT-21 STRUCT-24 STRUCT-26
#[actix_rt::test]
async fn only_a_structured_child_sees_the_tool_with_its_own_schema() {
    let model = ScriptedModel::with_script([
        capture(json!({"answer": 1})),
        ScriptStep::text("child"),
        capture(json!({"answer": 2})),
        ScriptStep::text("after"),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    // A plain agent calling the tool gets UNKNOWN_TOOL.
    let events = run_prompt(parent.agent(), "call it").await;
    assert_eq!(tool_error_codes(&events), ["UNKNOWN_TOOL"]);
    assert!(
        model.requests()[0].tools.is_empty(),
        "a plain agent without tools gets none"
    );
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).output_schema(answer_schema()),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let child_tools = &model.requests()[2].tools;
    assert_eq!(child_tools.len(), 1);
    assert_eq!(child_tools[0].parameters, answer_schema());
    run.dispose().await.unwrap();
}

// STRUCT-22
#[actix_rt::test]
async fn concurrent_structured_children_each_see_their_own_schema() {
    let respond = ScriptStep::Respond(Arc::new(|request: &subagents::GenerateRequest| {
        let schema = &request.tools[0].parameters;
        let args = if schema["properties"].get("verdict").is_some() {
            json!({"verdict": "real"})
        } else {
            json!({"answer": 1})
        };
        ScriptStep::tool_call("c1", "structured_output", args)
            .into_chunks()
            .unwrap_or_default()
    }));
    let model = ScriptedModel::repeating(respond);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let verdict_schema = json!({"type": "object", "properties": {"verdict": {"type": "string", "enum": ["real", "fake"]}}, "required": ["verdict"]});
    let first = rt.subagents().start(
        "spawn",
        SubagentStartRequest::new(parent.agent(), text("a")).output_schema(answer_schema()),
    );
    let second = rt.subagents().start(
        "spawn",
        SubagentStartRequest::new(parent.agent(), text("b")).output_schema(verdict_schema),
    );
    let (first, second) = futures::join!(first, second);
    let (first, second) = (first.unwrap(), second.unwrap());
    let (a, b) = futures::join!(first.result(), second.result());
    assert_eq!(a.unwrap().structured, Some(json!({"answer": 1})));
    assert_eq!(b.unwrap().structured, Some(json!({"verdict": "real"})));
    first.dispose().await.unwrap();
    second.dispose().await.unwrap();
}

// STRUCT-28 STRUCT-29
#[actix_rt::test]
async fn a_discarded_stage_is_never_promoted_by_a_later_call_even_with_a_reused_call_id() {
    let model = ScriptedModel::with_script([
        capture(json!({"answer": 1})),
        capture(json!({"answer": "bad"})),
        capture(json!({"answer": 3})),
    ]);
    let rt = seam_runtime(&model).await;
    rt.tools().post_execute(blocking_hook(true));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    assert_eq!(
        result.structured,
        Some(json!({"answer": 3})),
        "only the third call's own stage commits"
    );
    let outcome: Vec<bool> = results(&run).iter().map(|r| r.0).collect();
    assert_eq!(outcome, [true, true, false]);
    run.dispose().await.unwrap();
}

// STRUCT-30
#[actix_rt::test]
async fn a_denied_call_with_a_reused_id_cannot_promote_another_stage() {
    let model =
        ScriptedModel::with_script([capture(json!({"answer": 1})), capture(json!({"answer": 2}))]);
    let rt = seam_runtime(&model).await;
    let denied = Arc::new(AtomicBool::new(false));
    rt.tools().guard(Arc::new(move |call| {
        (call.name == "structured_output" && !denied.swap(true, Ordering::SeqCst))
            .then(|| "not yet".to_owned())
    }));
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    assert_eq!(
        run.result().await.unwrap().structured,
        Some(json!({"answer": 2}))
    );
    assert_eq!(
        tool_error_codes(&run.local_agent().unwrap().log().events()),
        ["TOOL_DENIED"]
    );
    run.dispose().await.unwrap();
}

// design-notes §8: the subset, every violation in one error.
#[test]
fn the_schema_subset_lists_every_violation() {
    let bad = json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "x"},
            "b": {"type": ["string", "null"]},
            "c": {"oneOf": [{"type": "string"}]},
            "d": {"type": "array", "items": [{"type": "string"}]},
            "e": {"type": "string", "enum": []},
            "f": {"type": "integer", "const": 1.5},
            "g": {"properties": {}},
            "h": {"type": "number", "enum": [1, 2], "const": 3},
            "i": {"type": "object", "additionalProperties": {"type": "string"}}
        },
        "required": ["a", "zz"],
        "$defs": {}
    });
    let error = assert_object_json_schema(&bad).unwrap_err();
    let message = error.message();
    for expected in [
        "keyword \"pattern\" is not supported",
        "schema.properties.b.type must be one of",
        "oneOf must be an array of at least two schemas",
        "schema.properties.e.enum must be a non-empty array",
        "schema.properties.f.const must be of type integer",
        "schema.properties.g.properties requires type or oneOf",
        "schema.properties.h.const must be a member of enum",
        "schema.properties.i.additionalProperties must be a boolean",
        "required names undeclared property \"zz\"",
        "keyword \"$defs\" is not supported",
    ] {
        assert!(
            message.contains(expected),
            "missing {expected:?} in {message}"
        );
    }
    let not_rooted = assert_object_json_schema(&json!({"type": "string"})).unwrap_err();
    assert!(not_rooted.message().contains("object-rooted"));
    assert_object_json_schema(&json!({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}, {"type": "null"}]}}})).unwrap();
}

#[test]
fn values_are_validated_against_the_subset() {
    let schema = ObjectSchema::new(json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "s": {"type": "string", "enum": ["a", "b"]},
            "o": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "any": {"description": "anything"}
        },
        "required": ["n"],
        "additionalProperties": false
    }))
    .unwrap();
    schema
        .validate(&json!({"n": 3, "s": "a", "o": 1.5, "any": [1, {"x": null}]}))
        .unwrap();
    for bad in [
        json!({}),
        json!({"n": 1.5}),
        json!({"n": 1, "s": "c"}),
        json!({"n": 1, "extra": true}),
        json!({"n": 1, "o": true}),
        json!({"n": 1, "any": -0.0}),
    ] {
        assert!(schema.validate(&bad).is_err(), "{bad} should fail");
    }
}

// design-notes §8: what the subset accepts, the validator must accept too.
#[test]
fn annotations_repeated_required_names_and_numbers_by_value_are_accepted() {
    let schema = ObjectSchema::new(json!({
        "type": "object",
        "examples": {"not": "an array"},
        "properties": {
            "n": {"type": "number", "enum": [1, 2], "const": 1.0, "examples": "one"}
        },
        "required": ["n", "n"]
    }))
    .expect("the subset accepts it, and so does the validator");
    schema.validate(&json!({"n": 1})).unwrap();
    assert!(schema.validate(&json!({"n": 2})).is_err(), "const wins");
    assert!(schema.validate(&json!({})).is_err(), "required still holds");
}

#[test]
fn a_schema_nested_too_deep_is_refused_without_crashing() {
    // Built by hand: `json!` would re-serialize the inner value at every level.
    fn nested(levels: usize) -> Value {
        let mut schema = json!({"type": "string"});
        for _ in 0..levels {
            let mut properties = serde_json::Map::new();
            properties.insert("x".into(), schema);
            let mut node = serde_json::Map::new();
            node.insert("type".into(), json!("object"));
            node.insert("properties".into(), Value::Object(properties));
            schema = Value::Object(node);
        }
        schema
    }
    let error = ObjectSchema::new(nested(4_096)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedSchema);
    assert!(error.message().contains("nest at most"), "{error}");
    ObjectSchema::new(nested(subagents::schema::MAX_SCHEMA_DEPTH - 1))
        .expect("the deepest allowed schema compiles");
}

#[actix_rt::test]
async fn a_structured_childs_end_event_agrees_with_its_result() {
    let model = ScriptedModel::with_script([capture(json!({"answer": 1}))]);
    let rt = seam_runtime(&model).await;
    let recorder = crate::support::SeamRecorder::new(&rt, EventScope::All);
    let (_parent, run) = structured_run(&rt, answer_schema()).await;
    let result = run.result().await.unwrap();
    recorder.wait_for_count(2).await;
    let end = recorder
        .events()
        .into_iter()
        .find_map(|event| match event {
            subagents::SubagentEvent::End(end) => Some(end),
            _ => None,
        })
        .expect("subagent/end");
    assert_eq!(
        end.last_assistant_message.unwrap_or_default(),
        result.output,
        "the end event shows exactly the result's output"
    );
    run.dispose().await.unwrap();
}
