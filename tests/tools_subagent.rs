//! The model-facing `subagent` tool (`providers-and-tools.md` §2.1, ids TOOL-SUB-nn by the
//! spec's test numbers): mounting with its provider, wording, routes, stop-reason errors and
//! configuration checks. Most tests delegate to a [`ScriptedProvider`]; the continuable route
//! runs real in-process children.
//!
//! Not ported: TOOL-SUB-09 (diagnostics: `SubagentResult` has no diagnostic field, seed
//! difference row 7); TOOL-SUB-24 (the tool is installed on a runtime, which always has the subagent service);
//! TOOL-SUB-29 and the job parts of TOOL-SUB-27 (no jobs service: a background one-shot call
//! is refused before any start, tested below).

use serde_json::{json, Value};
use subagents::model::ToolSchema;
use subagents::testing::{Gate, ScriptStep, ScriptedModel, ScriptedProvider};
use subagents::tools::{
    execute, install_subagent_tool, BackgroundMode, MaxDepthPolicy, SubagentToolConfig,
    SubagentToolInstallation, ToolLayer,
};
use subagents::{
    CallId, ContentBlock, ErrorCode, Runtime, StopReason, SubagentCapabilities, ToolCtx, ToolFilter,
};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, property_keys, root, run_prompt, seam_runtime, tool_results};

/// A runtime whose agents run `script` (then answer "done"), with `provider` registered.
async fn runtime_with(
    provider: &ScriptedProvider,
    script: Vec<ScriptStep>,
) -> (Runtime, ScriptedModel) {
    let model = ScriptedModel::with_script(script);
    model.set_fallback(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    rt.subagents()
        .register_provider(provider.clone())
        .await
        .unwrap()
        .keep();
    (rt, model)
}

async fn install(rt: &Runtime, config: SubagentToolConfig) -> SubagentToolInstallation {
    install_subagent_tool(rt, config)
        .await
        .expect("the tool installs")
}

fn call(id: &str, tool: &str, arguments: Value) -> ScriptStep {
    ScriptStep::tool_call(id, tool, arguments)
}

fn delegate(id: &str) -> ScriptStep {
    call(
        id,
        "subagent",
        json!({"description": "a task", "prompt": "do it"}),
    )
}

/// One turn of a fresh root that runs `script`; the tool results of its log.
async fn one_turn(rt: &Runtime) -> Vec<(bool, String)> {
    let parent = root(rt).await;
    let events = run_prompt(parent.agent(), "go").await;
    tool_results(&events)
}

/// The schema of `name` as the model saw it in its first request.
fn seen_schema(model: &ScriptedModel, name: &str) -> Option<ToolSchema> {
    model.requests().first().and_then(|request| {
        request
            .tools
            .iter()
            .find(|tool| tool.name == name)
            .map(|tool| ToolSchema::clone(tool))
    })
}

// TOOL-SUB-01
#[actix_rt::test]
async fn continuable_mode_is_refused_on_a_provider_that_cannot_prepare_continuable_children() {
    let provider = ScriptedProvider::new("mock");
    let (rt, _) = runtime_with(&provider, vec![]).await;
    let mut config = SubagentToolConfig::new("mock");
    config.background_mode = BackgroundMode::Continuable;
    let error = install_subagent_tool(&rt, config).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    assert!(error
        .message()
        .contains("does not support `backgroundMode: continuable`"));
    assert!(
        rt.tools().get("subagent").is_none(),
        "nothing stays installed"
    );
}

// TOOL-SUB-02 TOOL-SUB-20
#[actix_rt::test]
async fn the_tool_delegates_and_returns_the_childs_text() {
    let provider = ScriptedProvider::new("mock").reply(
        vec![ContentBlock::text("child says hi")],
        StopReason::Completed,
    );
    let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    assert_eq!(one_turn(&rt).await, [(false, "child says hi".to_owned())]);
    assert_eq!(provider.start_count(), 1);
    assert_eq!(
        provider.dispose_count(),
        1,
        "the run is disposed before the result returns"
    );
    let request = &provider.requests()[0].request;
    assert_eq!(request.label.as_deref(), Some("a task"));
    assert_eq!(request.prompt, [ContentBlock::text("do it")]);
}

// TOOL-SUB-03 TOOL-SUB-04
#[actix_rt::test]
async fn run_in_background_is_offered_only_when_the_instance_enables_it() {
    for enabled in [true, false] {
        let provider = ScriptedProvider::new("mock");
        let (rt, model) = runtime_with(&provider, vec![]).await;
        let mut config = SubagentToolConfig::new("mock");
        config.enable_run_in_background = enabled;
        install(&rt, config).await.keep();
        one_turn(&rt).await;
        let schema = seen_schema(&model, "subagent").expect("the model sees the tool");
        let mut expected = vec!["description".to_owned(), "prompt".to_owned()];
        if enabled {
            expected.push("run_in_background".to_owned());
        }
        assert_eq!(property_keys(&schema.parameters), expected);
        assert_eq!(schema.description.contains("job_output"), enabled);
        assert_eq!(
            schema.parameters["required"],
            json!(["description", "prompt"])
        );
    }
}

// TOOL-SUB-05
#[actix_rt::test]
async fn a_forced_background_call_is_refused_when_the_instance_disables_it() {
    let provider = ScriptedProvider::new("mock");
    let forced = call(
        "c1",
        "subagent",
        json!({"description": "d", "prompt": "p", "run_in_background": true}),
    );
    let (rt, _) = runtime_with(&provider, vec![forced, delegate("c2")]).await;
    let mut config = SubagentToolConfig::new("mock");
    config.enable_run_in_background = false;
    install(&rt, config).await.keep();
    let results = one_turn(&rt).await;
    assert_eq!(results.len(), 2);
    assert!(results[0].0);
    assert!(results[0]
        .1
        .contains("run_in_background is disabled for this tool instance"));
    assert_eq!(results[1], (false, "scripted reply".to_owned()));
    assert_eq!(
        provider.start_count(),
        1,
        "the refused call started nothing"
    );
}

// TOOL-SUB-06 TOOL-SUB-07
#[actix_rt::test]
async fn sibling_delegations_in_one_response_run_in_parallel() {
    let gate = Gate::new();
    let provider = ScriptedProvider::new("mock").gated(&gate);
    let both = ScriptStep::tool_calls(&[
        (
            "c1",
            "subagent",
            json!({"description": "one", "prompt": "first"}),
        ),
        (
            "c2",
            "subagent",
            json!({"description": "two", "prompt": "second"}),
        ),
    ]);
    let (rt, _) = runtime_with(&provider, vec![both]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let tool = rt.tools().get("subagent").unwrap();
    assert_eq!(tool.concurrency_mode(), subagents::tools::Concurrency::Safe);
    let parent = root(&rt).await;
    parent
        .agent()
        .followup(
            vec![ContentBlock::text("go")],
            subagents::MessageSource::User,
        )
        .await
        .unwrap();
    // Both children start while the first is still held: the calls overlap.
    eventually("both delegations started", || provider.start_count() == 2).await;
    gate.release();
    parent.agent().when_idle().await;
    let results = tool_results(&parent.agent().log().events());
    assert_eq!(results.len(), 2);
    assert!(results.iter().all(|(is_error, _)| !is_error));
}

// TOOL-SUB-09
#[actix_rt::test]
async fn provider_diagnostics_render_before_the_preserved_partial_output() {
    let provider = ScriptedProvider::new("mock")
        .reply(
            vec![ContentBlock::text("partial assistant text")],
            StopReason::Error,
        )
        .diagnostic("Codex hit its usage limit");
    let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    assert_eq!(
        one_turn(&rt).await,
        [(
            true,
            "Error: subagent run failed\nDiagnostic: Codex hit its usage limit\nPartial output \
             before the run ended:\npartial assistant text"
                .to_owned()
        )]
    );
}

// TOOL-SUB-08 TOOL-SUB-11 TOOL-SUB-20
#[actix_rt::test]
async fn a_stop_reason_other_than_completed_is_an_error_with_its_partial_output() {
    let cases = [
        (StopReason::Aborted, "subagent run was cancelled"),
        (StopReason::Error, "subagent run failed"),
        (
            StopReason::MaxTokens,
            "subagent run hit its token limit before finishing",
        ),
        (StopReason::Refusal, "subagent declined the task"),
        (
            StopReason::Other("frobnicated".into()),
            "subagent run ended abnormally (frobnicated)",
        ),
    ];
    for (stop_reason, headline) in cases {
        let provider = ScriptedProvider::new("mock").reply(
            vec![ContentBlock::text("partial assistant text")],
            stop_reason,
        );
        let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
        install(&rt, SubagentToolConfig::new("mock")).await.keep();
        let results = one_turn(&rt).await;
        assert_eq!(
            results,
            [(
                true,
                format!(
                    "Error: {headline}\nPartial output before the run ended:\npartial assistant text"
                )
            )]
        );
        assert_eq!(
            provider.dispose_count(),
            1,
            "disposed on the error path too"
        );
    }
}

// TOOL-SUB-10 TOOL-SUB-18
#[actix_rt::test]
async fn each_instance_routes_to_its_own_provider() {
    let first = ScriptedProvider::new("mock")
        .reply(vec![ContentBlock::text("from mock")], StopReason::Completed);
    let second = ScriptedProvider::new("acp")
        .reply(vec![ContentBlock::text("from acp")], StopReason::Completed);
    let (rt, _) = runtime_with(
        &first,
        vec![
            delegate("c1"),
            call(
                "c2",
                "subagent_acp",
                json!({"description": "d", "prompt": "p"}),
            ),
        ],
    )
    .await;
    rt.subagents()
        .register_provider(second.clone())
        .await
        .unwrap()
        .keep();
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let mut config = SubagentToolConfig::new("acp");
    config.tool_name = "subagent_acp".into();
    let acp = install(&rt, config).await;
    assert_eq!(
        one_turn(&rt).await,
        [
            (false, "from mock".to_owned()),
            (false, "from acp".to_owned())
        ]
    );
    assert_eq!((first.start_count(), second.start_count()), (1, 1));
    // Another provider's lifecycle leaves this tool alone.
    let other = rt
        .subagents()
        .register_provider(ScriptedProvider::new("other"))
        .await
        .unwrap();
    other.remove();
    assert!(acp.is_mounted());
}

// TOOL-SUB-12 TOOL-SUB-25 TOOL-SUB-26
#[actix_rt::test]
async fn configured_options_persona_filter_and_depth_reach_the_request() {
    let provider = ScriptedProvider::new("mock");
    let (rt, model) = runtime_with(&provider, vec![delegate("c1")]).await;
    let mut config = SubagentToolConfig::new("mock");
    config.agent_options = Some(subagents::ChildAgentOptions {
        model: Some("child-model".into()),
        ..Default::default()
    });
    config.persona = Some("You are terse.".into());
    config.tool_filter = Some(ToolFilter::deny(["dangerous"]));
    config.max_depth = MaxDepthPolicy::Limit(0);
    let configured = install(&rt, config).await;
    one_turn(&rt).await;
    configured.remove();
    assert!(rt.tools().get("subagent").is_none());
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    model.push(delegate("c2"));
    one_turn(&rt).await;
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let configured = &requests[0].request;
    assert_eq!(
        configured
            .agent_options
            .as_ref()
            .and_then(|o| o.model.as_deref()),
        Some("child-model")
    );
    assert_eq!(configured.persona.as_deref(), Some("You are terse."));
    let filter = configured.tool_filter.as_ref().unwrap();
    assert!(
        filter.allow.is_none(),
        "a deny-only filter has no allow list"
    );
    assert!(filter.deny.contains("dangerous"));
    assert_eq!(configured.max_depth, Some(0));
    let defaults = &requests[1].request;
    assert!(
        defaults.agent_options.is_none(),
        "omitted options send none"
    );
    assert!(defaults.tool_filter.is_none() && defaults.persona.is_none());
    assert_eq!(defaults.max_depth, Some(3));
}

// TOOL-SUB-25 TOOL-SUB-26
#[actix_rt::test]
async fn bad_configurations_are_refused_at_load_naming_the_field() {
    let provider = ScriptedProvider::new("mock");
    let (rt, _) = runtime_with(&provider, vec![]).await;
    let mut empty_filter = SubagentToolConfig::new("mock");
    empty_filter.tool_filter = Some(ToolFilter::default());
    let error = install_subagent_tool(&rt, empty_filter).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgs);
    assert!(error
        .message()
        .contains("`toolFilter` is configured but names neither `allow` nor `deny`"));
    for bad in [
        json!(-1),
        json!(1.5),
        json!("three"),
        json!(9_007_199_254_740_992_u64),
        json!(null),
    ] {
        let parsed = serde_json::from_value::<SubagentToolConfig>(
            json!({"provider": "mock", "maxDepth": bad}),
        );
        let error = parsed.expect_err("a bad maxDepth is refused").to_string();
        assert!(
            error.contains("maxDepth must be a non-negative safe integer"),
            "{error}"
        );
    }
    let managed: SubagentToolConfig =
        serde_json::from_value(json!({"provider": "mock", "maxDepth": "provider-managed"}))
            .unwrap();
    assert_eq!(managed.max_depth, MaxDepthPolicy::ProviderManaged);
    let unknown =
        serde_json::from_value::<SubagentToolConfig>(json!({"provider": "mock", "maxDeth": 2}));
    assert!(unknown.unwrap_err().to_string().contains("maxDeth"));
}

// TOOL-SUB-26
#[actix_rt::test]
async fn a_numeric_cap_needs_a_provider_that_can_enforce_it() {
    let provider = ScriptedProvider::new("remote").capabilities(SubagentCapabilities {
        depth_limit: false,
        ..SubagentCapabilities::ALL
    });
    let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
    let error = install_subagent_tool(&rt, SubagentToolConfig::new("remote"))
        .await
        .unwrap_err();
    assert!(
        error.message().contains("provider-managed"),
        "{}",
        error.message()
    );
    assert!(rt.tools().get("subagent").is_none());
    let mut config = SubagentToolConfig::new("remote");
    config.max_depth = MaxDepthPolicy::ProviderManaged;
    install(&rt, config).await.keep();
    one_turn(&rt).await;
    assert_eq!(
        provider.requests()[0].request.max_depth,
        None,
        "no cap is sent"
    );
}

// TOOL-SUB-14 TOOL-SUB-16 TOOL-SUB-19
#[actix_rt::test]
async fn the_tool_follows_its_providers_registration_and_rewords_on_every_mount() {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    // Installed before its provider exists: waiting, not mounted.
    let installation = install(&rt, SubagentToolConfig::new("late")).await;
    assert!(!installation.is_mounted());
    assert!(rt.tools().get("subagent").is_none());
    let fresh = rt
        .subagents()
        .register_provider(ScriptedProvider::new("late"))
        .await
        .unwrap();
    eventually("the tool mounts with its provider", || {
        rt.tools().get("subagent").is_some()
    })
    .await;
    let description = rt
        .tools()
        .get("subagent")
        .unwrap()
        .schema()
        .description
        .clone();
    assert!(description.contains("does not see this conversation"));
    let prompt = rt
        .tools()
        .get("subagent")
        .unwrap()
        .schema()
        .parameters
        .clone();
    assert!(prompt["properties"]["prompt"]["description"]
        .as_str()
        .unwrap()
        .contains("include everything it needs"));
    fresh.remove();
    eventually("the tool leaves with its provider", || {
        rt.tools().get("subagent").is_none()
    })
    .await;
    rt.subagents()
        .register_provider(ScriptedProvider::new("late").inherits_parent_context(true))
        .await
        .unwrap()
        .keep();
    eventually("the tool mounts again", || {
        rt.tools().get("subagent").is_some()
    })
    .await;
    let tool = rt.tools().get("subagent").unwrap();
    assert!(tool
        .schema()
        .description
        .contains("inherits this conversation"));
    assert!(!tool
        .schema()
        .description
        .contains("does not see this conversation"));
    assert!(
        tool.schema().parameters["properties"]["prompt"]["description"]
            .as_str()
            .unwrap()
            .contains("completed turns")
    );
    installation.remove();
}

// TOOL-SUB-17
#[actix_rt::test]
async fn a_removed_installation_unmounts_and_never_mounts_again() {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    let waiting = install(&rt, SubagentToolConfig::new("late")).await;
    waiting.remove();
    rt.subagents()
        .register_provider(ScriptedProvider::new("late"))
        .await
        .unwrap()
        .keep();
    // A mount would run as a task started by the registration: let one more provider
    // registration pass through the same service so that task has had its turn.
    let probe = rt
        .subagents()
        .register_provider(ScriptedProvider::new("probe"))
        .await
        .unwrap();
    probe.remove();
    let _ = rt.subagents().get_provider("late").await;
    assert!(rt.tools().get("subagent").is_none());
    let mounted = install(&rt, SubagentToolConfig::new("late")).await;
    assert!(mounted.is_mounted());
    drop(mounted);
    assert!(
        rt.tools().get("subagent").is_none(),
        "dropping the installation removes the tool"
    );
    assert!(
        rt.subagents().get_provider("late").await.is_some(),
        "the provider stays"
    );
}

// TOOL-SUB-21
#[actix_rt::test]
async fn result_and_disposal_failures_both_reach_the_model() {
    let failing_dispose = ScriptedProvider::new("mock").fail_dispose(
        subagents::SubagentError::new(ErrorCode::ActivationTeardownFailed, "dispose broke"),
    );
    let (rt, _) = runtime_with(&failing_dispose, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let results = one_turn(&rt).await;
    assert!(results[0].0);
    assert!(results[0].1.contains("dispose broke"), "{}", results[0].1);

    let both = ScriptedProvider::new("mock")
        .fail_result(subagents::SubagentError::new(
            ErrorCode::StoreIo,
            "result broke",
        ))
        .fail_dispose(subagents::SubagentError::new(
            ErrorCode::ActivationTeardownFailed,
            "dispose broke",
        ));
    let (rt, _) = runtime_with(&both, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let results = one_turn(&rt).await;
    assert_eq!(
        results,
        [(
            true,
            "Error: subagent run failed: result broke; dispose failed: dispose broke".to_owned()
        )]
    );
}

// TOOL-SUB-22
#[actix_rt::test]
async fn cancelling_the_turn_cancels_the_delegation() {
    let gate = Gate::new();
    let provider = ScriptedProvider::new("mock").gated(&gate);
    let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let parent = root(&rt).await;
    parent
        .agent()
        .followup(
            vec![ContentBlock::text("go")],
            subagents::MessageSource::User,
        )
        .await
        .unwrap();
    eventually("the delegation started", || provider.start_count() == 1).await;
    parent
        .agent()
        .cancel(
            subagents::CancelCause::User,
            subagents::InboxPolicy::Discard,
        )
        .await
        .unwrap();
    parent.agent().when_idle().await;
    assert!(
        provider.requests()[0].request.cancel.is_cancelled(),
        "the provider saw the cancel"
    );
    let results = tool_results(&parent.agent().log().events());
    assert!(results.iter().all(|(is_error, _)| *is_error));
}

// TOOL-SUB-13 TOOL-SUB-23
#[actix_rt::test]
async fn a_pre_aborted_call_or_one_without_a_calling_agent_starts_nothing() {
    let provider = ScriptedProvider::new("mock");
    let (rt, _) = runtime_with(&provider, vec![]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let parent = root(&rt).await;
    let arguments = r#"{"description": "d", "prompt": "p"}"#;
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let ctx = ToolCtx::for_agent(
        parent.agent(),
        CallId::new("c1"),
        "subagent".into(),
        cancelled,
    );
    let aborted = execute(&ToolLayer::default(), rt.tools(), ctx, arguments).await;
    assert!(aborted.is_error);
    assert_eq!(aborted.error.unwrap().code, "ABORTED_BEFORE_DISPATCH");
    // A call that names a session but carries no calling agent cannot act for it.
    let ctx = ToolCtx::new(
        parent.agent().id(),
        CallId::new("c2"),
        "subagent".into(),
        CancellationToken::new(),
    );
    let orphan = execute(&ToolLayer::default(), rt.tools(), ctx, arguments).await;
    assert!(orphan.is_error);
    let text: String = orphan
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect();
    assert_eq!(
        text,
        "Error: subagent requires a calling agent (exec.agent was undefined)"
    );
    assert_eq!(provider.start_count(), 0);
}

// TOOL-SUB-28
#[actix_rt::test]
async fn a_continuable_instance_starts_a_durable_child_in_the_background() {
    let model = ScriptedModel::with_script([delegate("c1")]);
    model.set_fallback(ScriptStep::text("child finished"));
    let rt = seam_runtime(&model).await;
    let mut config = SubagentToolConfig::new("spawn");
    config.background_mode = BackgroundMode::Continuable;
    install(&rt, config).await.keep();
    let tool = rt.tools().get("subagent").unwrap();
    let description = &tool.schema().description;
    assert!(description.contains("send_message"));
    assert!(description.contains("runs in the background by default"));
    assert!(!description.contains("job_output") && !description.contains("job_kill"));
    let parent = root(&rt).await;
    let events = run_prompt(parent.agent(), "go").await;
    let results = tool_results(&events);
    assert_eq!(results.len(), 1);
    let id = results[0]
        .1
        .strip_prefix("started subagent ")
        .expect("the acceptance line")
        .parse()
        .expect("a session id");
    let listed = rt
        .subagents()
        .list_children(parent.agent().id(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id(), id);
}

// TOOL-SUB-28
#[actix_rt::test]
async fn a_continuable_instance_answers_in_the_foreground_when_asked_to() {
    let model = ScriptedModel::with_script([
        call(
            "c1",
            "subagent",
            json!({"description": "now", "prompt": "answer now", "run_in_background": false}),
        ),
        ScriptStep::text("the answer"),
    ]);
    model.set_fallback(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    let mut config = SubagentToolConfig::new("spawn");
    config.background_mode = BackgroundMode::Continuable;
    install(&rt, config).await.keep();
    assert_eq!(one_turn(&rt).await, [(false, "the answer".to_owned())]);
}

// TOOL-SUB-15 TOOL-SUB-28
#[actix_rt::test]
async fn continuable_guidance_is_in_the_prompt_exactly_while_the_agent_sees_the_tool() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let guidance = "Use subagent in the background by default.";
    let mut one_shot = SubagentToolConfig::new("spawn");
    one_shot.tool_name = "subagent_once".into();
    install(&rt, one_shot).await.keep();
    let system = |model: &ScriptedModel| model.requests().last().and_then(|r| r.system.clone());
    // A one-shot instance carries no guidance.
    one_turn(&rt).await;
    assert!(!system(&model)
        .unwrap_or_default()
        .contains("in the background by default"));
    let mut config = SubagentToolConfig::new("spawn");
    config.background_mode = BackgroundMode::Continuable;
    let installation = install(&rt, config).await;
    one_turn(&rt).await;
    assert!(system(&model).unwrap().contains(guidance));
    // Hidden by a restriction: the tool and its guidance both.
    let restricted = crate::support::agent_with(&rt, |scope| {
        scope.restrict(ToolFilter::deny(["subagent"])).unwrap();
    })
    .await;
    run_prompt(restricted.agent(), "go").await;
    let request = model.requests().last().cloned().unwrap();
    assert!(request.tools.iter().all(|tool| tool.name != "subagent"));
    assert!(!request.system.unwrap_or_default().contains(guidance));
    // Unmounted: gone from the next step of an agent that saw it.
    installation.remove();
    one_turn(&rt).await;
    assert!(!system(&model).unwrap_or_default().contains(guidance));
}

// A structured result reads as JSON (issue #11: "structured results rendered as JSON").
#[actix_rt::test]
async fn a_structured_result_reaches_the_model_as_json() {
    let provider = ScriptedProvider::new("mock").structured(json!({"files": 3, "ok": true}));
    let (rt, _) = runtime_with(&provider, vec![delegate("c1")]).await;
    install(&rt, SubagentToolConfig::new("mock")).await.keep();
    let results = one_turn(&rt).await;
    assert_eq!(results.len(), 1);
    let shown: Value = serde_json::from_str(&results[0].1).expect("JSON");
    assert_eq!(shown, json!({"files": 3, "ok": true}));
}

// TOOL-SUB-16 (a kept installation)
#[actix_rt::test]
async fn a_kept_installation_still_follows_its_provider() {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    let registration = rt
        .subagents()
        .register_provider(ScriptedProvider::new("kept"))
        .await
        .unwrap();
    install(&rt, SubagentToolConfig::new("kept")).await.keep();
    assert!(rt.tools().get("subagent").is_some());
    registration.remove();
    eventually("unmounted with its provider", || {
        rt.tools().get("subagent").is_none()
    })
    .await;
    rt.subagents()
        .register_provider(ScriptedProvider::new("kept").inherits_parent_context(true))
        .await
        .unwrap()
        .keep();
    eventually("mounted again, reworded", || {
        rt.tools().get("subagent").is_some_and(|tool| {
            tool.schema()
                .description
                .contains("inherits this conversation")
        })
    })
    .await;
}
