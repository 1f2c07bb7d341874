//! The turn driver: steps, tool calls, stop reasons and what a cancellation records.

use std::sync::Arc;

use serde_json::json;
use subagents::host::{PreStepDecision, PreStepHook};
use subagents::model::{BlockType, FinishReason, StreamChunk};
use subagents::session::{fold_consumed_work, one_shot_stop_reason, LlmFailure};
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{
    CancelCause, ContentBlock, CreateAgent, EventKind, InboxPolicy, MessageSource, Runtime,
    StopReason, Tool, ToolError, ToolOutput, TurnEndReason,
};
use tokio::sync::Notify;

use crate::support::{
    agent_with, memory_runtime, run_prompt, text, tool_error_codes, turn_ends, types, within,
};

fn runtime_with_tools(model: &ScriptedModel, tools: Vec<Tool>) -> Runtime {
    tools
        .into_iter()
        .fold(
            Runtime::builder()
                .store(subagents::MemoryStore::new())
                .model("scripted", model.clone()),
            |b, t| b.tool(t),
        )
        .build()
        .unwrap()
}

fn echo_tool() -> Tool {
    Tool::new(
        "echo",
        "Echoes its text.",
        json!({"type": "object"}),
        |args, _| async move {
            Ok(ToolOutput::text(
                args["text"].as_str().unwrap_or_default().to_owned(),
            ))
        },
    )
}

async fn run_one(rt: &Runtime, prompt: &str) -> Vec<subagents::SessionEvent> {
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    handle
        .agent()
        .followup(text(prompt), MessageSource::User)
        .await
        .unwrap();
    within("the turn", handle.agent().when_idle()).await;
    let events = handle.agent().log().events();
    handle.dispose().await.unwrap();
    events
}

#[actix_rt::test]
async fn a_text_turn_logs_the_full_step_structure() {
    let model = ScriptedModel::with_script([ScriptStep::text("hello")]);
    let events = run_one(&memory_runtime(&model), "hi").await;
    assert_eq!(
        types(&events),
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let message = events.iter().find_map(|e| match &e.kind {
        EventKind::AssistantMessage { message, usage, .. } => Some((
            message.clone(),
            usage.as_deref().copied(),
            e.source_event_seqs.clone(),
        )),
        _ => None,
    });
    let (message, usage, sources) = message.unwrap();
    assert_eq!(message.content, text("hello"));
    assert_eq!(
        usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((10, 5))
    );
    assert_eq!(*sources, [5, 6, 7, 8], "the message cites its chunks");
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
}

#[actix_rt::test]
async fn tool_calls_run_and_feed_the_next_step() {
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "echo", json!({"text": "pong"})),
        ScriptStep::text("the tool said pong"),
    ]);
    let rt = runtime_with_tools(&model, vec![echo_tool()]);
    let events = run_one(&rt, "ping").await;
    let (call_seq, result) = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult { message, error, .. } => Some((
                e.source_event_seqs.clone(),
                (message.clone(), error.clone()),
            )),
            _ => None,
        })
        .unwrap();
    assert!(
        matches!(
            events[usize::try_from(call_seq[0]).unwrap()].kind,
            EventKind::ToolCall { .. }
        ),
        "the result cites its call"
    );
    assert_eq!(result.1, None);
    assert!(
        matches!(&result.0.content[0], ContentBlock::ToolResult { content, is_error: false, .. } if content == &text("pong"))
    );
    let second = &model.requests()[1];
    assert_eq!(
        second.messages.len(),
        3,
        "prompt, assistant tool call, tool result"
    );
    assert_eq!(
        second
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["echo"]
    );
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
}

#[actix_rt::test]
async fn an_unknown_tool_is_an_error_result_the_model_can_read() {
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "nope", json!({})),
        ScriptStep::text("sorry"),
    ]);
    let events = run_one(&memory_runtime(&model), "x").await;
    let result = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { message, error, .. } => Some((message.clone(), error.clone())),
        _ => None,
    });
    let (message, error) = result.unwrap();
    assert_eq!(error.map(|e| e.code), Some("UNKNOWN_TOOL".to_owned()));
    assert!(
        matches!(&message.content[0], ContentBlock::ToolResult { content, is_error: true, .. }
        if content == &text("Error: unknown tool \"nope\""))
    );
}

#[actix_rt::test]
async fn max_tokens_drops_tool_calls_and_ends_the_turn_max_tokens() {
    let mut chunks = match ScriptStep::tool_call("c1", "echo", json!({})) {
        ScriptStep::Chunks(chunks) => chunks,
        _ => unreachable!(),
    };
    chunks.insert(
        0,
        StreamChunk::TextDelta {
            index: 9,
            text: "cut".into(),
        },
    );
    *chunks.last_mut().unwrap() = StreamChunk::Finish {
        reason: FinishReason::MaxTokens,
    };
    let model = ScriptedModel::with_script([ScriptStep::Chunks(chunks)]);
    let rt = runtime_with_tools(&model, vec![echo_tool()]);
    let events = run_one(&rt, "x").await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolCall { .. })),
        "no tool ran"
    );
    let content = events.iter().find_map(|e| match &e.kind {
        EventKind::AssistantMessage { message, .. } => Some(message.content.clone()),
        _ => None,
    });
    assert_eq!(content.unwrap(), text("cut"));
    assert_eq!(turn_ends(&events), [TurnEndReason::MaxTokens]);
    assert_eq!(
        one_shot_stop_reason(fold_consumed_work(&events).end.as_ref()),
        StopReason::MaxTokens
    );
}

#[actix_rt::test]
async fn a_refusal_ends_the_turn_blocked_which_maps_to_refusal() {
    let model = ScriptedModel::with_script([ScriptStep::refusal("I cannot help with that.")]);
    let events = run_one(&memory_runtime(&model), "x").await;
    assert_eq!(turn_ends(&events), [TurnEndReason::Blocked]);
    assert_eq!(
        one_shot_stop_reason(fold_consumed_work(&events).end.as_ref()),
        StopReason::Refusal
    );
}

#[actix_rt::test]
async fn a_model_failure_ends_the_turn_error_with_the_failure() {
    let model = ScriptedModel::with_script([ScriptStep::fail("RATE_LIMITED", "slow down")]);
    let events = run_one(&memory_runtime(&model), "x").await;
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Error {
            error: LlmFailure::new("RATE_LIMITED", "slow down")
        }]
    );
    assert!(
        types(&events).contains(&"step/end".to_owned()),
        "the step still closes"
    );
    assert_eq!(
        one_shot_stop_reason(fold_consumed_work(&events).end.as_ref()),
        StopReason::Error
    );
}

#[actix_rt::test]
async fn an_exhausted_script_fails_the_turn() {
    let model = ScriptedModel::new();
    let events = run_one(&memory_runtime(&model), "x").await;
    assert!(
        matches!(&turn_ends(&events)[..], [TurnEndReason::Error { error }] if error.code == "SCRIPT_EXHAUSTED")
    );
}

#[actix_rt::test]
async fn a_silent_stream_end_counts_as_stop() {
    let model = ScriptedModel::with_script([ScriptStep::Chunks(vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "no finish".into(),
        },
    ])]);
    let events = run_one(&memory_runtime(&model), "x").await;
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
}

#[actix_rt::test]
async fn a_pre_step_reject_blocks_the_turn_before_any_step() {
    let model = ScriptedModel::new();
    let rt = memory_runtime(&model);
    let reject: PreStepHook = Arc::new(|_, _| PreStepDecision::Reject);
    let handle = agent_with(&rt, move |scope| {
        scope.on_pre_step(reject);
    })
    .await;
    run_prompt(handle.agent(), "x").await;
    let events = handle.agent().log().events();
    assert_eq!(turn_ends(&events), [TurnEndReason::Blocked]);
    assert!(!types(&events).contains(&"step/start".to_owned()));
    assert_eq!(model.request_count(), 0);
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_pre_step_hook_can_append_between_claim_and_step() {
    let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
    let rt = memory_runtime(&model);
    let hook: PreStepHook = Arc::new(|pre, decision| {
        if pre.step == 1 {
            pre.log
                .append(EventKind::Extension {
                    event_type: "subagent/descriptor".into(),
                    data: json!({"version": 2}),
                })
                .unwrap();
        }
        decision
    });
    let handle = agent_with(&rt, move |scope| {
        scope.on_pre_step(hook);
    })
    .await;
    run_prompt(handle.agent(), "x").await;
    let events = handle.agent().log().events();
    assert_eq!(
        types(&events)[1..5],
        [
            "turn/start",
            "agent/inbox/spliced",
            "subagent/descriptor",
            "step/start"
        ]
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn cancel_mid_stream_records_the_partial_text_as_interrupted() {
    let gate = subagents::testing::Gate::new();
    let partial = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "partial".into(),
        },
    ];
    let model = ScriptedModel::with_script([ScriptStep::Split {
        head: partial,
        gate: gate.clone(),
        tail: vec![],
    }]);
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("x"), MessageSource::User)
        .await
        .unwrap();
    // The gate is reached only after the driver logged the partial chunk and asked for more.
    within("the partial chunk", gate.reached()).await;
    agent
        .cancel(CancelCause::Parent, InboxPolicy::Discard)
        .await
        .unwrap();
    within("the cancelled turn", agent.when_idle()).await;
    let events = agent.log().events();
    let tail = types(&events[events.len() - 3..]);
    assert_eq!(tail, ["assistant/message", "step/end", "turn/end"]);
    assert!(matches!(&events[events.len() - 3].kind,
        EventKind::AssistantMessage { message, interrupted: true, .. } if message.content == text("partial")));
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
    assert!(
        model.requests()[0].cancel.is_cancelled(),
        "the model request saw the cancel"
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn cancel_during_tools_aborts_the_running_call_and_never_dispatches_the_rest() {
    let started = Arc::new(Notify::new());
    let signal = Arc::clone(&started);
    let slow = Tool::new(
        "slow",
        "Waits forever.",
        json!({"type": "object"}),
        move |_, _| {
            let signal = Arc::clone(&signal);
            async move {
                signal.notify_one();
                std::future::pending::<Result<ToolOutput, ToolError>>().await
            }
        },
    );
    let model = ScriptedModel::with_script([ScriptStep::tool_calls(&[
        ("c1", "slow", json!({})),
        ("c2", "echo", json!({})),
    ])]);
    let rt = runtime_with_tools(&model, vec![slow, echo_tool()]);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("x"), MessageSource::User)
        .await
        .unwrap();
    within("the slow tool to start", started.notified()).await;
    agent
        .cancel(CancelCause::User, InboxPolicy::Discard)
        .await
        .unwrap();
    within("the cancelled turn", agent.when_idle()).await;
    let events = agent.log().events();
    let codes = tool_error_codes(&events);
    assert_eq!(codes, ["ABORTED", "ABORTED_BEFORE_DISPATCH"]);
    let calls = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolCall { .. }))
        .count();
    assert_eq!(
        calls, 2,
        "the never-started call still gets a synthetic tool/call"
    );
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Aborted {
            reason: CancelCause::User
        }]
    );
    assert_eq!(model.request_count(), 1, "no step follows a cancel");
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn conclude_turn_ends_the_turn_after_the_tool_result() {
    let finish = Tool::new(
        "finish",
        "Ends the turn.",
        json!({"type": "object"}),
        |_, ctx: subagents::ToolCtx| async move {
            ctx.conclude_turn();
            Ok(ToolOutput::text("done"))
        },
    );
    let model = ScriptedModel::with_script([ScriptStep::tool_call("c1", "finish", json!({}))]);
    let rt = runtime_with_tools(&model, vec![finish]);
    let events = run_one(&rt, "x").await;
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
    assert_eq!(
        model.request_count(),
        1,
        "no model step after a concluding tool"
    );
}

#[actix_rt::test]
async fn tool_context_messages_enter_the_next_step() {
    let contextual = Tool::new(
        "ctx",
        "Adds context.",
        json!({"type": "object"}),
        |_, _| async move {
            Ok(ToolOutput {
                additional_contexts: vec![subagents::Message::user(
                    text("extra context"),
                    MessageSource::User,
                )],
                ..ToolOutput::text("ok")
            })
        },
    );
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "ctx", json!({})),
        ScriptStep::text("fine"),
    ]);
    let rt = runtime_with_tools(&model, vec![contextual]);
    let events = run_one(&rt, "x").await;
    let step2 = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::StepStart { step: 2, .. }))
        .unwrap();
    assert!(
        matches!(&events[step2 + 1].kind, EventKind::UserMessage(m) if m.text() == "extra context")
    );
}

#[actix_rt::test]
async fn turn_numbers_continue_across_turns() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    for prompt in ["a", "b", "c"] {
        handle
            .agent()
            .followup(text(prompt), MessageSource::User)
            .await
            .unwrap();
        within("the turn", handle.agent().when_idle()).await;
    }
    let turns: Vec<u64> = handle
        .agent()
        .log()
        .events()
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(turns, [1, 2, 3]);
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_steered_tool_step_after_a_finished_step_still_reaches_the_model() {
    let gate = subagents::testing::Gate::new();
    let model = ScriptedModel::with_script([
        ScriptStep::text("first answer").gated(&gate),
        ScriptStep::tool_call("c1", "echo", json!({"text": "x"})),
        ScriptStep::text("saw the tool"),
    ]);
    let rt = runtime_with_tools(&model, vec![echo_tool()]);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("go"), MessageSource::User)
        .await
        .unwrap();
    within("step 1", gate.reached()).await;
    agent
        .steer(text("also use the tool"), MessageSource::User)
        .await
        .unwrap();
    gate.release();
    within("the turn", agent.when_idle()).await;
    assert_eq!(
        model.request_count(),
        3,
        "the tool step's results went back to the model"
    );
    let third = &model.requests()[2];
    assert!(matches!(
        third.messages.last().map(|m| &m.content[0]),
        Some(ContentBlock::ToolResult { .. })
    ));
    assert_eq!(turn_ends(&agent.log().events()), [TurnEndReason::Completed]);
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_panicking_tool_is_an_error_result_and_the_agent_lives_on() {
    let boom = Tool::new("boom", "Panics.", json!({}), |_, _| async {
        panic!("tool bug")
    });
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "boom", json!({})),
        ScriptStep::text("recovered"),
        ScriptStep::text("next turn"),
    ]);
    let rt = runtime_with_tools(&model, vec![boom]);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    run_prompt(handle.agent(), "x").await;
    run_prompt(handle.agent(), "y").await;
    let events = handle.agent().log().events();
    let code = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { error, .. } => error.as_ref().map(|e| e.code.clone()),
        _ => None,
    });
    assert_eq!(code.as_deref(), Some("TOOL_PANICKED"));
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_panicking_pre_step_hook_fails_the_turn_and_the_agent_lives_on() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = memory_runtime(&model);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let trip = Arc::clone(&armed);
    let hook: PreStepHook = Arc::new(move |_, decision| {
        if trip.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("policy bug");
        }
        decision
    });
    let handle = agent_with(&rt, move |scope| {
        scope.on_pre_step(hook);
    })
    .await;
    for prompt in ["a", "b"] {
        handle
            .agent()
            .followup(text(prompt), MessageSource::User)
            .await
            .unwrap();
        within("the turn", handle.agent().when_idle()).await;
    }
    assert_eq!(
        turn_ends(&handle.agent().log().events()),
        [
            TurnEndReason::Error {
                error: LlmFailure::new("UNKNOWN", "a pre-step hook panicked")
            },
            TurnEndReason::Completed
        ]
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn repeated_call_ids_from_the_model_are_made_distinct() {
    let model = ScriptedModel::with_script([
        ScriptStep::tool_calls(&[
            ("dup", "echo", json!({"text": "1"})),
            ("dup", "echo", json!({"text": "2"})),
        ]),
        ScriptStep::text("done"),
    ]);
    let rt = runtime_with_tools(&model, vec![echo_tool()]);
    let events = run_one(&rt, "x").await;
    let ids: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall { call_id, .. } => Some(call_id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["dup", "dup-1"]);
    assert_eq!(turn_ends(&events), [TurnEndReason::Completed]);
}

#[actix_rt::test]
async fn a_turn_stopping_hook_can_steer_one_more_step() {
    let model = ScriptedModel::with_script([ScriptStep::text("draft"), ScriptStep::text("final")]);
    let rt = memory_runtime(&model);
    let once = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let handle = agent_with(&rt, move |scope| {
        scope.on_turn_stopping(Arc::new(move |_| {
            if once.swap(false, std::sync::atomic::Ordering::SeqCst) {
                vec![subagents::Message::user(
                    text("double-check"),
                    MessageSource::User,
                )]
            } else {
                Vec::new()
            }
        }));
    })
    .await;
    run_prompt(handle.agent(), "go").await;
    let events = handle.agent().log().events();
    assert_eq!(crate::support::user_texts(&events), ["go", "double-check"]);
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Completed],
        "the steer extended the same turn"
    );
    assert_eq!(model.request_count(), 2);
    handle.dispose().await.unwrap();
}
