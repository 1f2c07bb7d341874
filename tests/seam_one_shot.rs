//! One-shot runs through the in-process providers: results, lineage, disposal, cancellation,
//! options, depth and settlement.

use std::sync::Arc;

use serde_json::json;
use subagents::host::{PreStepDecision, PreStepHook};
use subagents::model::{BlockType, FinishReason, StreamChunk};
use subagents::seam::{settle_run, JobOutcome};
use subagents::session::SessionOrigin;
use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel, ScriptedProvider};
use subagents::{
    AgentEvent, AgentEventKind, AgentOptions, CancelCause, ChildAgentOptions, ContentBlock,
    CreateAgent, ErrorCode, EventKind, EventScope, MemoryStore, Runtime, StopReason, SubagentError,
    SubagentStartRequest, TurnEndReason,
};
use tokio_util::sync::CancellationToken;

use crate::support::{
    memory_runtime, root, run_prompt, seam_runtime, seam_runtime_from, start_run, text, turn_ends,
    within,
};

/// A seam runtime whose store can be made to fail, and that counts flushes.
async fn faulty_runtime(model: ScriptedModel) -> (Runtime, Arc<FaultInjectingStore>) {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = crate::support::seam_runtime_on(
        Runtime::builder().model("scripted", model),
        faults.clone(),
    )
    .await;
    (rt, faults)
}

// SPAWN-01 SPAWN-03 SPAWN-05 DRV-01 DRV-09
#[actix_rt::test]
async fn a_fresh_child_runs_to_completion_in_its_own_session_and_is_disposed() {
    let model = ScriptedModel::with_script([ScriptStep::text("child answer")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "do it").await;
    let child = run
        .local_agent()
        .cloned()
        .expect("an in-process run has a local child");
    assert!(
        rt.agents().is_live(&child).await,
        "published before start returned"
    );
    assert_ne!(run.id(), parent.agent().id());
    assert_eq!(child.id(), run.id());
    let header = child.header();
    assert_eq!(header.parent_session, Some(parent.agent().id()));
    assert_eq!(header.origin, Some(SessionOrigin::Subagent));
    assert_eq!(header.delegation_depth, Some(1));
    assert_eq!(child.options().subagent_depth, 1);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.output, text("child answer"));
    assert!(
        rt.agents().get(run.id()).await.is_some(),
        "still registered until disposed"
    );
    run.dispose().await.unwrap();
    run.dispose().await.unwrap();
    assert!(
        rt.agents().get(run.id()).await.is_none(),
        "disposed to quiescence"
    );
}

// SPAWN-08 SPAWN-09
#[actix_rt::test]
async fn child_turn_endings_map_to_stop_reasons() {
    let cases = [
        (
            ScriptStep::max_tokens("cut"),
            StopReason::MaxTokens,
            text("cut"),
        ),
        (
            ScriptStep::fail("SCRIPT_EXHAUSTED", "no more"),
            StopReason::Error,
            vec![],
        ),
        (ScriptStep::refusal("no"), StopReason::Refusal, text("no")),
    ];
    for (step, reason, output) in cases {
        let model = ScriptedModel::with_script([step]);
        let rt = seam_runtime(&model).await;
        let parent = root(&rt).await;
        let run = start_run(&rt, "spawn", parent.agent(), "x").await;
        let result = run.result().await.unwrap();
        assert_eq!((result.stop_reason, result.output), (reason, output));
        run.dispose().await.unwrap();
    }
}

// SPAWN-14 CONT-86
#[actix_rt::test]
async fn a_one_shot_run_offers_no_continuation_and_continuable_creation_is_a_provider_capability() {
    use subagents::seam::{ContinuableCreateRequest, SubagentProvider};
    use subagents::testing::ScriptedProvider;
    let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    // A run is one delegation: `SubagentRun` has no steer and no resume (the type offers
    // nothing to call), and once disposed its child is gone for good.
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let child = run.local_agent().unwrap().clone();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    assert_eq!(
        child
            .steer(text("more"), subagents::MessageSource::User)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::AgentDisposed,
        "a disposed one-shot child takes no steering"
    );
    assert!(rt.agents().get(child.id()).await.is_none());

    // Continuable creation is a capability a provider has or lacks.
    assert!(
        ScriptedProvider::new("plain").continuable().is_none(),
        "a provider without prepare_continuable cannot make continuable children"
    );
    let spawn = subagents::SpawnInProcess::default();
    let prepare = spawn
        .continuable()
        .expect("spawn can prepare continuable children");
    let spec = prepare
        .prepare_continuable(ContinuableCreateRequest {
            session_id: subagents::SessionId::new(),
            parent: parent.agent().clone(),
            cancel: CancellationToken::new(),
        })
        .await
        .unwrap();
    assert_eq!(spec.seed, None, "spawn children start fresh");
}

// SPAWN-15 DRV-02
#[actix_rt::test]
async fn the_child_inherits_the_parent_cwd_and_takes_explicit_model_selectors() {
    let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
    let rt = seam_runtime(&model).await;
    let parent = rt
        .agents()
        .create(CreateAgent::new().cwd("/workspace"))
        .await
        .unwrap();
    let options = ChildAgentOptions {
        provider: Some("scripted".into()),
        model: Some("mock".into()),
        max_tokens: None,
    };
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).agent_options(options),
        )
        .await
        .unwrap();
    let child = run.local_agent().unwrap().clone();
    assert_eq!(
        child.header().cwd.as_deref(),
        Some(std::path::Path::new("/workspace"))
    );
    assert_eq!(child.options().provider.as_deref(), Some("scripted"));
    assert_eq!(child.options().model, "mock");
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    assert_eq!(model.requests()[0].model, "mock");
    run.dispose().await.unwrap();
}

// SPAWN-16 DRV-15
#[actix_rt::test]
async fn a_routeless_parent_gives_the_child_only_its_depth() {
    let model = ScriptedModel::with_script([ScriptStep::text("default route")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let child = run.local_agent().unwrap().clone();
    assert_eq!(
        *child.options(),
        AgentOptions {
            subagent_depth: 1,
            ..AgentOptions::default()
        },
        "no invented provider or model"
    );
    // Unlike the TypeScript runtime, this one has a default route, so the child still runs.
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    run.dispose().await.unwrap();
}

// DRV-10
#[actix_rt::test]
async fn the_child_inherits_the_token_cap_and_accepts_an_override() {
    for (override_cap, expected) in [(None, 111), (Some(222), 222)] {
        let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
        let rt = seam_runtime(&model).await;
        let options = AgentOptions {
            max_tokens: Some(111),
            ..AgentOptions::default()
        };
        let parent = rt
            .agents()
            .create(CreateAgent::new().options(options))
            .await
            .unwrap();
        let mut request = SubagentStartRequest::new(parent.agent(), text("x"));
        if let Some(cap) = override_cap {
            request = request.agent_options(ChildAgentOptions {
                max_tokens: Some(cap),
                ..ChildAgentOptions::default()
            });
        }
        let run = rt.subagents().start("spawn", request).await.unwrap();
        run.result().await.unwrap();
        assert_eq!(model.requests()[0].max_tokens, Some(expected));
        assert_eq!(
            run.local_agent().unwrap().options().max_tokens,
            Some(expected)
        );
        run.dispose().await.unwrap();
    }
}

// DRV-03
#[actix_rt::test]
async fn a_prompt_discarded_by_a_pre_step_rejection_is_a_refusal() {
    let model = ScriptedModel::repeating(ScriptStep::text("parent"));
    let parent_id = Arc::new(std::sync::OnceLock::new());
    let parent_only = Arc::clone(&parent_id);
    let reject_children: PreStepHook = Arc::new(move |step, decision| {
        if parent_only.get() == Some(&step.agent) {
            decision
        } else {
            PreStepDecision::Reject
        }
    });
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .pre_step_hook(reject_children),
    )
    .await;
    let parent = root(&rt).await;
    parent_id.set(parent.agent().id()).unwrap();
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Refusal);
    let child_log = run.local_agent().unwrap().log().events();
    assert!(
        !child_log
            .iter()
            .any(|e| e.kind.type_name() == "subagent/descriptor"),
        "a rejected first step records no descriptor"
    );
    run.dispose().await.unwrap();
}

// DRV-04
#[actix_rt::test]
async fn a_one_shot_run_adds_no_durability_checkpoint() {
    let (rt, faults) =
        faulty_runtime(ScriptedModel::with_script([ScriptStep::max_tokens("long")])).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::MaxTokens
    );
    let child = run.local_agent().unwrap().clone();
    run.dispose().await.unwrap();
    assert_eq!(faults.flush_count(), 0, "no flush was asked for");
    assert_eq!(turn_ends(&child.log().events()), [TurnEndReason::MaxTokens]);
    let stored = rt.store().unwrap().read_from(child.id(), 0).await.unwrap();
    assert_eq!(
        stored.len(),
        child.log().len() as usize,
        "disposal drained the whole log into the store"
    );
}

// DRV-05 (the disposal channel)
#[actix_rt::test]
async fn a_failed_release_surfaces_on_dispose_not_on_the_result() {
    let (rt, faults) = faulty_runtime(ScriptedModel::with_script([ScriptStep::text("fine")])).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    faults.arm(subagents::testing::StoreOperation::Append);
    // Nothing is pending, so arm a failure the drain must report: one more event.
    run.local_agent()
        .unwrap()
        .inject(text("late"), subagents::MessageSource::User)
        .await
        .unwrap();
    let error = run.dispose().await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreIo);
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed,
        "the result channel is untouched"
    );
    assert!(
        rt.agents().get(run.id()).await.is_none(),
        "the child was released all the same"
    );
}

// DRV-07
#[actix_rt::test]
async fn earlier_text_survives_a_final_empty_usage_only_message() {
    let first = match ScriptStep::tool_call("t1", "missing", json!({})) {
        ScriptStep::Chunks(mut chunks) => {
            chunks.insert(
                0,
                StreamChunk::BlockStart {
                    index: 9,
                    block_type: BlockType::Text,
                },
            );
            chunks.insert(
                1,
                StreamChunk::TextDelta {
                    index: 9,
                    text: "partial one".into(),
                },
            );
            chunks
        }
        _ => unreachable!(),
    };
    let usage_only = vec![StreamChunk::Finish {
        reason: FinishReason::MaxTokens,
    }];
    let model =
        ScriptedModel::with_script([ScriptStep::Chunks(first), ScriptStep::Chunks(usage_only)]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert!(
        result.output.contains(&ContentBlock::text("partial one")),
        "{:?}",
        result.output
    );
    run.dispose().await.unwrap();
}

// DRV-14 SPAWN-10
#[actix_rt::test]
async fn an_already_cancelled_request_publishes_nothing() {
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let parent = root(&rt).await;
    let token = CancellationToken::new();
    token.cancel();
    let error = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).cancel(token),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
    assert_eq!(rt.agents().list().await.len(), 1);
}

// DRV-16 SPAWN-12 SPAWN-13
#[actix_rt::test]
async fn the_request_token_and_dispose_cancel_a_published_run() {
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
    let model = ScriptedModel::with_script([
        ScriptStep::Split {
            head: partial,
            gate: gate.clone(),
            tail: vec![],
        },
        ScriptStep::Hang,
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let token = CancellationToken::new();
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).cancel(token.clone()),
        )
        .await
        .unwrap();
    within("the child mid-stream", gate.reached()).await;
    token.cancel();
    let result = within("the cancelled result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.output, text("partial"));
    assert!(model.requests()[0].cancel.is_cancelled());
    let child_log = run.local_agent().unwrap().log().events();
    assert_eq!(
        turn_ends(&child_log),
        [TurnEndReason::Aborted {
            reason: CancelCause::Parent
        }]
    );
    run.dispose().await.unwrap();

    let second = start_run(&rt, "spawn", parent.agent(), "y").await;
    second.dispose().await.unwrap();
    assert_eq!(
        second.result().await.unwrap().stop_reason,
        StopReason::Aborted,
        "disposed mid-turn"
    );
}

// A dropped dispose never strands the disposal.
#[actix_rt::test]
async fn a_dispose_dropped_after_its_first_poll_still_releases_the_child() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let child = run.local_agent().unwrap().clone();
    {
        let mut first = Box::pin(run.dispose());
        assert!(futures::poll!(first.as_mut()).is_pending());
    }
    within("the shared disposal", run.dispose()).await.unwrap();
    assert!(!child.is_alive(), "the child was released");
    assert!(rt.agents().get(run.id()).await.is_none());
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
}

// SPAWN-11
#[actix_rt::test]
async fn a_same_tick_cancel_rejects_the_start_and_publishes_nothing() {
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let parent = root(&rt).await;
    let created = crate::support::EventRecorder::new(&rt, parent.agent().id());
    let seam = crate::support::SeamRecorder::new(&rt, EventScope::All);
    let token = CancellationToken::new();
    let starting = rt.subagents().start(
        "spawn",
        SubagentStartRequest::new(parent.agent(), text("x")).cancel(token.clone()),
    );
    token.cancel();
    let error = starting.await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
    assert_eq!(rt.agents().list().await.len(), 1, "no child agent");
    assert_eq!(
        rt.store().unwrap().list().await.unwrap().len(),
        0,
        "no child session"
    );
    assert!(seam.events().is_empty(), "no subagent/start or end");
    assert!(created.kinds().is_empty());
}

// DRV-18
#[actix_rt::test]
async fn a_cancel_right_after_publication_is_an_aborted_run_with_an_id() {
    let model = ScriptedModel::repeating(ScriptStep::text("never sent"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let token = CancellationToken::new();
    let fire = token.clone();
    let parent_id = parent.agent().id();
    // Fires the moment the child is published, before the run's watcher exists.
    let _sub = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            if event.kind == AgentEventKind::Created && event.agent != parent_id {
                fire.cancel();
            }
        });
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).cancel(token),
        )
        .await
        .unwrap();
    assert!(
        rt.agents().get(run.id()).await.is_some(),
        "the run was published"
    );
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.output),
        (StopReason::Aborted, vec![])
    );
    assert_eq!(model.request_count(), 0, "the prompt was never sent");
    run.dispose().await.unwrap();
    assert_eq!(rt.agents().list().await.len(), 1);
}

#[actix_rt::test]
async fn a_disposed_parent_cannot_delegate() {
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let parent = root(&rt).await;
    let stale = parent.agent().clone();
    parent.dispose().await.unwrap();
    let error = rt
        .subagents()
        .start("spawn", SubagentStartRequest::new(&stale, text("x")))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentDisposed);
    assert!(error.message().contains("inactive context"));
    assert!(rt.agents().list().await.is_empty(), "no orphaned child");
}

// DRV-06
#[actix_rt::test]
async fn a_max_tokens_turn_is_reported_as_max_tokens_with_no_flush() {
    let (rt, faults) = faulty_runtime(ScriptedModel::with_script([ScriptStep::max_tokens(
        "cut short",
    )]))
    .await;
    let parent = root(&rt).await;
    let flushes = faults.flush_count();
    let run = start_run(&rt, "spawn", parent.agent(), "long task").await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    let events = run.local_agent().unwrap().log().events();
    assert_eq!(turn_ends(&events).last(), Some(&TurnEndReason::MaxTokens));
    assert_eq!(
        faults.flush_count(),
        flushes,
        "the one-shot path never flushes"
    );
    run.dispose().await.unwrap();
}

// SPAWN-06 SPAWN-07
#[actix_rt::test]
async fn child_depth_is_parent_depth_plus_one_and_the_cap_is_enforced() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).max_depth(1),
        )
        .await
        .unwrap();
    assert_eq!(run.local_agent().unwrap().options().subagent_depth, 1);
    run.dispose().await.unwrap();
    let error = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).max_depth(0),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DepthExceeded);
    assert_eq!(error.message(), "subagent depth 1 exceeds max_depth 0");
}

// DRV-11 DRV-12
#[actix_rt::test]
async fn the_persisted_header_depth_is_a_floor_runtime_depth_can_only_deepen() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let cases = [
        (1, 0, 1, "subagent depth 2 exceeds max_depth 1"),
        (2, 1, 2, "subagent depth 3 exceeds max_depth 2"),
    ];
    for (header_depth, runtime_depth, cap, message) in cases {
        let options = AgentOptions {
            subagent_depth: runtime_depth,
            ..AgentOptions::default()
        };
        let parent = rt
            .agents()
            .create(
                CreateAgent::new()
                    .delegated_by(subagents::SessionId::new(), header_depth)
                    .options(options),
            )
            .await
            .unwrap();
        let error = rt
            .subagents()
            .start(
                "spawn",
                SubagentStartRequest::new(parent.agent(), text("x")).max_depth(cap),
            )
            .await
            .unwrap_err();
        assert_eq!(
            (error.code(), error.message()),
            (ErrorCode::DepthExceeded, message)
        );
    }
}

// DRV-13
#[actix_rt::test]
async fn invalid_depths_are_refused_before_publication() {
    use subagents::seam::depth::parse_max_depth;
    for bad in [
        json!(-1),
        json!(1.5),
        json!(-0.0),
        json!("2"),
        json!(9_007_199_254_740_992_u64),
    ] {
        let error = parse_max_depth(&bad).unwrap_err();
        assert_eq!(error.code(), ErrorCode::InvalidMaxDepth, "{bad}");
    }
    assert_eq!(parse_max_depth(&json!(3)).unwrap(), 3);
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let max_safe = (1u64 << 53) - 1;
    for (runtime_depth, code) in [
        (max_safe + 1, ErrorCode::InvalidSubagentDepth),
        (max_safe, ErrorCode::DepthOverflow),
    ] {
        let options = AgentOptions {
            subagent_depth: runtime_depth,
            ..AgentOptions::default()
        };
        let parent = rt
            .agents()
            .create(CreateAgent::new().options(options))
            .await
            .unwrap();
        let error = rt
            .subagents()
            .start(
                "spawn",
                SubagentStartRequest::new(parent.agent(), text("x")),
            )
            .await
            .unwrap_err();
        assert_eq!(error.code(), code);
    }
    assert_eq!(rt.agents().list().await.len(), 2, "no child was published");
}

// RSET-01
#[actix_rt::test]
async fn settle_run_maps_each_stop_reason_onto_a_job_outcome() {
    let cases = [
        (
            StopReason::Completed,
            JobOutcome::Completed {
                output: "partial".into(),
            },
        ),
        (StopReason::Aborted, JobOutcome::Killed),
        (
            StopReason::Error,
            JobOutcome::Failed {
                detail: "error".into(),
            },
        ),
        (
            StopReason::MaxTokens,
            JobOutcome::Failed {
                detail: "max-tokens".into(),
            },
        ),
        (
            StopReason::Refusal,
            JobOutcome::Failed {
                detail: "refusal".into(),
            },
        ),
        (
            StopReason::Other("paused".into()),
            JobOutcome::Failed {
                detail: "paused".into(),
            },
        ),
    ];
    for (reason, outcome) in cases {
        let rt = memory_runtime(&ScriptedModel::new());
        let parent = root(&rt).await;
        rt.subagents()
            .register_provider(ScriptedProvider::new("p").reply(text("partial"), reason))
            .await
            .unwrap()
            .keep();
        let run = start_run(&rt, "p", parent.agent(), "x").await;
        assert_eq!(settle_run(&run).await, outcome);
    }
}

// RSET-02
#[actix_rt::test]
async fn settle_run_disposes_before_reporting_on_every_path() {
    let transport = SubagentError::new(ErrorCode::StoreIo, "transport gone");
    let reap = SubagentError::new(ErrorCode::StoreIo, "reap failed");
    let cases = [
        (
            ScriptedProvider::new("p").fail_result(transport.clone()),
            "STORE_IO: transport gone".to_owned(),
        ),
        (
            ScriptedProvider::new("p").fail_dispose(reap.clone()),
            "dispose failed: STORE_IO: reap failed".to_owned(),
        ),
        (
            ScriptedProvider::new("p")
                .fail_result(transport)
                .fail_dispose(reap),
            "STORE_IO: transport gone; dispose failed: STORE_IO: reap failed".to_owned(),
        ),
    ];
    for (provider, detail) in cases {
        let rt = memory_runtime(&ScriptedModel::new());
        let parent = root(&rt).await;
        rt.subagents()
            .register_provider(provider)
            .await
            .unwrap()
            .keep();
        let run = start_run(&rt, "p", parent.agent(), "x").await;
        assert_eq!(settle_run(&run).await, JobOutcome::Failed { detail });
    }
}

// RSET-03
#[actix_rt::test]
async fn settle_run_keeps_a_provider_diagnostic_beside_the_stop_reason() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let provider = ScriptedProvider::new("p")
        .reply(text("partial"), StopReason::Error)
        .diagnostic("Claude Code denied a tool request");
    rt.subagents()
        .register_provider(provider)
        .await
        .unwrap()
        .keep();
    let run = start_run(&rt, "p", parent.agent(), "x").await;
    assert_eq!(
        settle_run(&run).await,
        JobOutcome::Failed {
            detail: "error; diagnostic: Claude Code denied a tool request".to_owned()
        }
    );
}

// RSET-04
#[test]
fn a_diagnostic_is_bounded_at_a_character_boundary_and_marks_its_cut() {
    let limit = subagents::SubagentResult::DIAGNOSTIC_LIMIT;
    let exact = "d".repeat(limit);
    let kept = subagents::SubagentResult::empty(StopReason::Error).with_diagnostic(exact.clone());
    assert_eq!(kept.diagnostic.as_deref(), Some(exact.as_str()));
    assert_eq!(kept.stop_reason, StopReason::Error);
    // Three-byte characters: no cut may split one.
    let long = "€".repeat(limit);
    let cut = subagents::SubagentResult::empty(StopReason::Error).with_diagnostic(long);
    let diagnostic = cut.diagnostic.unwrap();
    assert!(diagnostic.len() <= limit, "{} bytes", diagnostic.len());
    assert!(diagnostic.ends_with("\n[diagnostic truncated]"));
    let body = diagnostic.trim_end_matches("\n[diagnostic truncated]");
    assert!(body.chars().all(|c| c == '€') && !body.is_empty());
}

// MULTI-02
#[actix_rt::test]
async fn one_parent_drives_a_spawn_child_and_a_fork_child_then_keeps_working() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("parent turn one"),
        ScriptStep::text("spawn reply"),
        ScriptStep::text("fork reply"),
        ScriptStep::text("parent turn two"),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    let spawned = start_run(&rt, "spawn", parent.agent(), "spawned task").await;
    assert_eq!(spawned.result().await.unwrap().output, text("spawn reply"));
    let forked = start_run(&rt, "fork", parent.agent(), "forked task").await;
    assert_eq!(forked.result().await.unwrap().output, text("fork reply"));
    assert_ne!(spawned.id(), forked.id());
    let spawn_log = spawned.local_agent().unwrap().log().events();
    let fork_log = forked.local_agent().unwrap().log().events();
    let first_user = |events: &[subagents::SessionEvent]| {
        events.iter().find_map(|e| match &e.kind {
            EventKind::UserMessage(m) => Some(m.text()),
            _ => None,
        })
    };
    assert_eq!(
        first_user(&spawn_log).as_deref(),
        Some("spawned task"),
        "spawn inherits nothing"
    );
    assert_eq!(
        first_user(&fork_log).as_deref(),
        Some("first"),
        "fork inherits the parent's turn"
    );
    spawned.dispose().await.unwrap();
    forked.dispose().await.unwrap();
    let events = run_prompt(parent.agent(), "second").await;
    assert_eq!(
        turn_ends(&events).len(),
        2,
        "the parent's log holds only its own turns"
    );
    assert_eq!(
        subagents::session::final_assistant_output(&events),
        text("parent turn two")
    );
}

/// A runtime with agents spread over two worker threads, and its model (answers `done`).
async fn on_two_workers() -> (Runtime, ScriptedModel) {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    model.set_recording(false);
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .workers(2),
    )
    .await;
    (rt, model)
}

// Agents spread over worker threads behave as on one: every run completes and is released.
#[actix_rt::test]
async fn runs_spread_over_worker_threads_all_complete() {
    let (rt, model) = on_two_workers().await;
    let parent = root(&rt).await;
    let runs = futures::future::join_all((0..200).map(|i| {
        rt.subagents().start(
            if i % 2 == 0 { "spawn" } else { "fork" },
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
    }))
    .await;
    for run in runs {
        let run = run.unwrap();
        let result = within("a run on a worker", run.result()).await.unwrap();
        assert_eq!(
            (result.stop_reason, result.output),
            (StopReason::Completed, text("done"))
        );
        run.dispose().await.unwrap();
    }
    assert_eq!(model.request_count(), 200);
    assert_eq!(
        rt.agents().list().await.len(),
        1,
        "every child was released"
    );
}

// Dispose is idempotent and harmless in every configuration: after the runtime's shutdown
// released every child and stopped its workers, disposing a run answers `Ok`, as on one thread.
#[actix_rt::test]
async fn a_run_disposed_after_shutdown_on_workers_is_a_harmless_no_op() {
    let (rt, _) = on_two_workers().await;
    let parent = root(&rt).await;
    let mut runs = Vec::new();
    for _ in 0..4 {
        let run = rt
            .subagents()
            .start(
                "spawn",
                SubagentStartRequest::new(parent.agent(), text("x")),
            )
            .await
            .unwrap();
        within("a run on a worker", run.result()).await.unwrap();
        runs.push(run);
    }
    within("the shutdown", rt.shutdown()).await.unwrap();
    for run in &runs {
        within("a dispose after shutdown", run.dispose())
            .await
            .expect("a dispose after shutdown is a harmless no-op");
        run.dispose().await.expect("and stays one");
    }
}

// On worker threads a run's `subagent/end` comes from the run's own task and its disposal runs
// on the child's worker: every start is paired with one end carrying the run's outcome, and a
// disposed run still reads its child's log from the caller's thread.
#[actix_rt::test]
async fn runs_on_workers_pair_every_start_with_one_end_and_keep_their_logs_readable() {
    let (rt, _) = on_two_workers().await;
    let parent = root(&rt).await;
    let recorder = crate::support::SeamRecorder::new(&rt, subagents::EventScope::All);
    let runs = futures::future::join_all((0..100).map(|_| {
        rt.subagents().start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
    }))
    .await;
    let mut ids = Vec::new();
    for run in runs {
        let run = run.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
        let child = run.local_agent().expect("an in-process run").clone();
        assert_eq!(
            subagents::session::final_assistant_output(child.log().events()),
            text("done"),
            "a disposed child's log stays readable"
        );
        ids.push(run.id());
    }
    recorder
        .wait_until("every end", |events| {
            events
                .iter()
                .filter(|event| matches!(event, subagents::SubagentEvent::End(_)))
                .count()
                >= ids.len()
        })
        .await;
    let events = recorder.events();
    for id in &ids {
        let starts = events
            .iter()
            .filter(
                |event| matches!(event, subagents::SubagentEvent::Start(info) if info.id == *id),
            )
            .count();
        let ends: Vec<_> = events
            .iter()
            .filter_map(|event| match event {
                subagents::SubagentEvent::End(end) if end.info.id == *id => Some(end),
                _ => None,
            })
            .collect();
        assert_eq!((starts, ends.len()), (1, 1), "run {id}");
        assert_eq!(ends[0].stop_reason, StopReason::Completed);
        assert_eq!(ends[0].last_assistant_message, Some(text("done")));
    }
}

// A start handed to a worker and dropped by its caller leaves no child behind, whether the
// cancel reached the worker before or after the child was published.
#[actix_rt::test]
async fn a_dropped_start_handed_to_a_worker_leaves_no_child() {
    let (rt, _) = on_two_workers().await;
    let parent = root(&rt).await;
    for _ in 0..50 {
        let start = rt.subagents().start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")),
        );
        // Polled once, so the start is sent, then dropped.
        assert!(futures::FutureExt::now_or_never(start).is_none());
    }
    let kept = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
        .await
        .unwrap();
    assert_eq!(kept.result().await.unwrap().output, text("done"));
    kept.dispose().await.unwrap();
    within("every dropped start's child to be released", async {
        while rt.agents().list().await.len() > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

// A start is enqueued when `start` is called; a future dropped before its first poll cancels
// it all the same, so no child is ever created for it.
#[actix_rt::test]
async fn a_start_dropped_before_its_first_poll_creates_no_child() {
    let model = ScriptedModel::repeating(ScriptStep::text("done"));
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&created);
    let _sub = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            if event.kind == AgentEventKind::Created {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    drop(rt.subagents().start(
        "spawn",
        SubagentStartRequest::new(parent.agent(), text("dropped")),
    ));
    // Starts reach the provider in call order, and on one arbiter their creations run in that
    // order: once the kept child has answered, the dropped start's creation has been refused.
    let kept = start_run(&rt, "spawn", parent.agent(), "kept").await;
    assert_eq!(kept.result().await.unwrap().output, text("done"));
    assert_eq!(
        created.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the kept start created a child"
    );
    assert_eq!(model.request_count(), 1);
    kept.dispose().await.unwrap();
}

// A store built to forget one-shot children drops each one's session at disposal (and only
// then); the default store keeps it. (Not a catalog behavior: the load hot path's option.)
#[actix_rt::test]
async fn a_forgetting_store_drops_a_one_shot_session_at_disposal_and_the_default_keeps_it() {
    for forgetting in [true, false] {
        let store: Arc<MemoryStore> = Arc::new(if forgetting {
            MemoryStore::forgetting_one_shots()
        } else {
            MemoryStore::new()
        });
        let model = ScriptedModel::repeating(ScriptStep::text("done"));
        let rt = crate::support::seam_runtime_on(
            Runtime::builder().model("scripted", model),
            store.clone(),
        )
        .await;
        let parent = root(&rt).await;
        let run = start_run(&rt, "spawn", parent.agent(), "work").await;
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed);
        use subagents::SessionPersistence;
        assert!(
            store.header(run.id()).await.is_ok(),
            "the session is stored until the run is disposed"
        );
        run.dispose().await.unwrap();
        let after = store.header(run.id()).await;
        if forgetting {
            assert_eq!(after.unwrap_err().code(), ErrorCode::SessionNotFound);
        } else {
            assert!(after.is_ok(), "the default store keeps a disposed child");
        }
        // The parent is untouched either way.
        assert!(store.header(parent.agent().id()).await.is_ok());
    }
}
