//! Tools: agent layers shadowing globals, restrictions, guards and parallel calls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::tools::{Concurrency, ToolLayer};
use subagents::{
    AgentScope, CreateAgent, ErrorCode, EventKind, Runtime, SessionLog, Tool, ToolFilter,
    ToolOutput, ToolRegistry,
};
use tokio::sync::Barrier;

use crate::support::{run_prompt, text, tool_error_codes};

fn named(name: &str, answer: &'static str) -> Tool {
    Tool::new(
        name,
        "",
        json!({"type": "object"}),
        move |_, _| async move { Ok(ToolOutput::text(answer)) },
    )
}

fn names(tools: &[Tool]) -> Vec<&str> {
    tools.iter().map(Tool::name).collect()
}

#[test]
fn agent_tools_shadow_globals_and_masks_intersect() {
    let globals = ToolRegistry::new();
    for name in ["read", "write", "bash"] {
        globals.register(named(name, "global")).unwrap();
    }
    assert_eq!(
        globals.register(named("read", "again")).unwrap_err().code(),
        ErrorCode::DuplicateTool
    );
    let mut layer = ToolLayer::default();
    layer.register(named("read", "scoped")).unwrap();
    assert_eq!(
        names(&layer.visible(&globals)),
        ["bash", "read", "write"],
        "sorted by name"
    );
    layer
        .restrict(&globals, ToolFilter::allow(["write", "bash"]))
        .unwrap();
    layer
        .restrict(&globals, ToolFilter::deny(["bash"]))
        .unwrap();
    assert_eq!(
        names(&layer.visible(&globals)),
        ["read", "write"],
        "masks intersect; scoped tools are unmasked"
    );
    assert!(
        layer.get(&globals, "bash").is_none(),
        "a masked tool is gone"
    );

    globals.register(named("late", "")).unwrap();
    assert!(
        layer.get(&globals, "late").is_none(),
        "allow excludes globals registered later"
    );
    let mut deny_only = ToolLayer::default();
    deny_only
        .restrict(&globals, ToolFilter::deny(["bash"]))
        .unwrap();
    globals.register(named("later", "")).unwrap();
    assert!(
        deny_only.get(&globals, "later").is_some(),
        "deny admits globals registered later"
    );
}

#[test]
fn bad_restrictions_are_typed_errors_that_change_nothing() {
    let globals = ToolRegistry::new();
    globals.register(named("read", "")).unwrap();
    let mut layer = ToolLayer::default();
    layer.register(named("mine", "")).unwrap();
    assert_eq!(
        layer
            .restrict(&globals, ToolFilter::default())
            .unwrap_err()
            .code(),
        ErrorCode::InvalidRestriction
    );
    assert_eq!(
        layer
            .restrict(&globals, ToolFilter::deny(["mine"]))
            .unwrap_err()
            .code(),
        ErrorCode::InvalidRestriction
    );
    assert_eq!(
        layer
            .restrict(&globals, ToolFilter::allow(["read", "ghost"]))
            .unwrap_err()
            .code(),
        ErrorCode::UnknownTool
    );
    assert_eq!(names(&layer.visible(&globals)), ["mine", "read"]);
}

#[actix_rt::test]
async fn a_masked_tool_refuses_to_run_and_a_guard_refuses_with_its_reason() {
    let model = ScriptedModel::with_script([
        ScriptStep::tool_calls(&[
            ("c1", "bash", json!({})),
            ("c2", "read", json!({"path": "/etc/shadow"})),
        ]),
        ScriptStep::text("ok"),
    ]);
    let rt = Runtime::builder()
        .model("scripted", model.clone())
        .tool(named("bash", "ran"))
        .tool(named("read", "ran"))
        .build()
        .unwrap();
    let handle = rt
        .agents()
        .create(
            CreateAgent::new().setup(|scope: &mut AgentScope, _: &SessionLog| {
                scope.restrict(ToolFilter::deny(["bash"]))?;
                scope.guard(Arc::new(|call| {
                    (call.arguments["path"] == "/etc/shadow")
                        .then(|| "reading secrets is not allowed".to_owned())
                }));
                Ok(None)
            }),
        )
        .await
        .unwrap();
    let codes = tool_error_codes(&run_prompt(handle.agent(), "go").await);
    assert_eq!(codes, ["UNKNOWN_TOOL", "TOOL_DENIED"]);
    let offered: Vec<_> = model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(
        offered,
        ["read"],
        "the masked tool is not offered to the model"
    );
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn concurrency_safe_calls_run_together_and_commit_in_model_order() {
    // Both calls wait on a barrier of two: the step finishes only if they run at once.
    let barrier = Arc::new(Barrier::new(2));
    let running = Arc::new(AtomicUsize::new(0));
    let make = |answer: &'static str| {
        let barrier = Arc::clone(&barrier);
        let running = Arc::clone(&running);
        Tool::new(answer, "", json!({}), move |_, _| {
            let barrier = Arc::clone(&barrier);
            let running = Arc::clone(&running);
            async move {
                running.fetch_add(1, Ordering::SeqCst);
                barrier.wait().await;
                Ok(ToolOutput::text(answer))
            }
        })
        .concurrency(Concurrency::Safe)
    };
    let model = ScriptedModel::with_script([
        ScriptStep::tool_calls(&[("c1", "first", json!({})), ("c2", "second", json!({}))]),
        ScriptStep::text("done"),
    ]);
    let rt = Runtime::builder()
        .model("scripted", model)
        .tool(make("first"))
        .tool(make("second"))
        .build()
        .unwrap();
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    run_prompt(handle.agent(), "go").await;
    let results: Vec<_> = handle
        .agent()
        .log()
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { message, .. } => Some(message.content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        format!("{:?}", results[0]).contains("first")
            && format!("{:?}", results[1]).contains("second")
    );
    assert_eq!(running.load(Ordering::SeqCst), 2);
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_failing_tool_is_an_error_result_and_observers_see_every_result() {
    let failing = Tool::new("fail", "", json!({}), |_, _| async {
        Err(subagents::ToolError::new(
            "INVALID_ARGS",
            "path is required",
        ))
    });
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "fail", json!({})),
        ScriptStep::text("ok"),
    ]);
    let rt = Runtime::builder()
        .model("scripted", model)
        .tool(failing)
        .build()
        .unwrap();
    let handle = rt
        .agents()
        .create(
            CreateAgent::new().setup(move |scope: &mut AgentScope, _: &SessionLog| {
                scope.on_tool_result(Arc::new(move |seen| {
                    sink.lock()
                        .unwrap()
                        .push((seen.name.to_owned(), seen.result.is_error))
                }));
                Ok(None)
            }),
        )
        .await
        .unwrap();
    run_prompt(handle.agent(), "go").await;
    assert_eq!(*seen.lock().unwrap(), [("fail".to_owned(), true)]);
    let result = handle
        .agent()
        .log()
        .events()
        .into_iter()
        .find_map(|e| match e.kind {
            EventKind::ToolResult { message, error, .. } => Some((message, error)),
            _ => None,
        });
    let (message, error) = result.unwrap();
    assert_eq!(error.unwrap().code, "INVALID_ARGS");
    assert!(
        matches!(&message.content[0], subagents::ContentBlock::ToolResult { content, is_error: true, .. }
        if content == &text("Error: path is required"))
    );
    handle.dispose().await.unwrap();
}

#[test]
fn arguments_parse_leniently() {
    use subagents::tools::parse_arguments;
    assert_eq!(parse_arguments(""), json!({}));
    assert_eq!(parse_arguments("{\"a\":1}"), json!({"a": 1}));
    assert_eq!(
        parse_arguments("{oops"),
        json!("{oops"),
        "invalid JSON passes through as a string"
    );
}
