//! The seam's provider registry, capability validation and lifecycle events.

use std::sync::{Arc, Mutex};

use serde_json::json;
use subagents::seam::SubagentRunInfo;
use subagents::testing::{Gate, ScriptStep, ScriptedModel, ScriptedProvider};
use subagents::{
    ErrorCode, EventScope, StopReason, SubagentCapabilities, SubagentError, SubagentEvent,
    SubagentProvider, SubagentStartRequest,
};

use crate::support::{memory_runtime, root, seam_runtime, start_run, text, within, SeamRecorder};

fn start_info(event: &SubagentEvent) -> Option<&SubagentRunInfo> {
    match event {
        SubagentEvent::Start(info) => Some(info),
        _ => None,
    }
}

// SVC-01
#[actix_rt::test]
async fn registers_lists_looks_up_starts_and_removes_providers() {
    let rt = memory_runtime(&ScriptedModel::new());
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    let parent = root(&rt).await;
    let alpha = ScriptedProvider::new("alpha");
    let shared: Arc<dyn SubagentProvider> = Arc::new(alpha.clone());
    let registration = rt
        .subagents()
        .register_shared(Arc::clone(&shared))
        .await
        .unwrap();
    assert_eq!(rt.subagents().list().await, ["alpha"]);
    let found = rt.subagents().get_provider("alpha").await.unwrap();
    assert!(
        Arc::ptr_eq(&found, &shared),
        "lookup returns the registered provider itself"
    );
    let run = start_run(&rt, "alpha", parent.agent(), "go").await;
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    assert_eq!(alpha.start_count(), 1);
    registration.remove();
    assert!(rt.subagents().get_provider("alpha").await.is_none());
    let names: Vec<_> = recorder
        .events()
        .into_iter()
        .filter_map(|e| match e {
            SubagentEvent::ProviderAdded(name) => Some(format!("added {name}")),
            SubagentEvent::ProviderRemoved(name) => Some(format!("removed {name}")),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["added alpha", "removed alpha"]);
    run.dispose().await.unwrap();
}

// SVC-02
#[actix_rt::test]
async fn a_refusing_provider_added_listener_rolls_the_registration_back() {
    let rt = memory_runtime(&ScriptedModel::new());
    let _veto = rt
        .subagents()
        .events()
        .subscribe(EventScope::All, |event: &SubagentEvent| match event {
            SubagentEvent::ProviderAdded(_) => Err("not today"),
            _ => Ok(()),
        });
    let error = rt
        .subagents()
        .register_provider(ScriptedProvider::new("alpha"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ListenerRejected);
    assert!(error.message().contains("not today"));
    assert!(
        rt.subagents().list().await.is_empty(),
        "the provider is not registered"
    );
}

// SVC-03
#[actix_rt::test]
async fn duplicate_and_absent_provider_names_are_typed_errors() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    rt.subagents()
        .register_provider(ScriptedProvider::new("dup"))
        .await
        .unwrap()
        .keep();
    let error = rt
        .subagents()
        .register_provider(ScriptedProvider::new("dup"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DuplicateProvider);
    let error = rt
        .subagents()
        .start(
            "missing",
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NoProvider);
}

// SPAWN-18 FORK-09 MULTI-01
#[actix_rt::test]
async fn spawn_and_fork_coexist_and_unregister() {
    let rt = memory_runtime(&ScriptedModel::new());
    let spawn = rt
        .subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap();
    let fork = rt
        .subagents()
        .register_provider(subagents::ForkInProcess::default())
        .await
        .unwrap();
    let mut names = rt.subagents().list().await;
    names.sort();
    assert_eq!(names, ["fork", "spawn"]);
    spawn.remove();
    assert_eq!(rt.subagents().list().await, ["fork"]);
    fork.remove();
    assert!(rt.subagents().list().await.is_empty());
}

// SPAWN-20
#[actix_rt::test]
async fn removing_a_provider_never_revokes_an_accepted_run() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let rt = memory_runtime(&model);
    let registration = rt
        .subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    let token = tokio_util::sync::CancellationToken::new();
    let request = SubagentStartRequest::new(parent.agent(), text("work"))
        .output_schema(json!({"type": "object", "properties": {"answer": {"type": "number"}}}))
        .cancel(token.clone());
    let run = rt.subagents().start("spawn", request).await.unwrap();
    registration.remove();
    assert!(rt.subagents().get_provider("spawn").await.is_none());
    assert!(
        rt.agents().get(run.id()).await.is_some(),
        "the child stays registered"
    );
    assert!(
        !rt.tools().unregister("structured_output"),
        "nothing was registered globally"
    );
    token.cancel();
    let result = within("the cancelled run", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    assert!(rt.agents().get(run.id()).await.is_none());
}

// STRUCT-25
#[actix_rt::test]
async fn a_capture_still_works_after_the_provider_is_removed_and_dies_with_the_child() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([ScriptStep::tool_call(
        "c1",
        "structured_output",
        json!({"answer": 4}),
    )
    .gated(&gate)]);
    let rt = memory_runtime(&model);
    let registration = rt
        .subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    let request = SubagentStartRequest::new(parent.agent(), text("work"))
        .output_schema(json!({"type": "object", "properties": {"answer": {"type": "number"}}}));
    let run = rt.subagents().start("spawn", request).await.unwrap();
    within("the child's model call", gate.reached()).await;
    registration.remove();
    assert!(rt.subagents().get_provider("spawn").await.is_none());
    gate.release();
    let result = within("the capture", run.result()).await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Completed, Some(json!({"answer": 4})))
    );
    let child = run.local_agent().unwrap().clone();
    run.dispose().await.unwrap();
    assert!(
        !child.is_alive(),
        "the tool's only home, the child's scope, is gone"
    );
    assert!(rt.agents().get(run.id()).await.is_none());
}

// SPAWN-21
#[actix_rt::test]
async fn a_start_after_removal_creates_nothing() {
    let rt = memory_runtime(&ScriptedModel::new());
    let registration = rt
        .subagents()
        .register_provider(subagents::SpawnInProcess::default())
        .await
        .unwrap();
    let parent = root(&rt).await;
    registration.remove();
    let error = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::NoProvider);
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent exists");
}

// SVC-08
#[actix_rt::test]
async fn each_unsupported_capability_is_refused_before_provider_startup() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let bare = ScriptedProvider::new("bare").capabilities(SubagentCapabilities::NONE);
    rt.subagents()
        .register_provider(bare.clone())
        .await
        .unwrap()
        .keep();
    let base = || SubagentStartRequest::new(parent.agent(), text("x"));
    let requests = [
        base().output_schema(json!({"type": "object", "properties": {}})),
        base().max_depth(1),
        base().tool_filter(subagents::ToolFilter::deny(["bash"])),
        base().persona("reviewer"),
    ];
    for request in requests {
        let error = rt.subagents().start("bare", request).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::UnsupportedCapability);
    }
    assert_eq!(bare.start_count(), 0, "the provider never started");
}

// SVC-09
#[actix_rt::test]
async fn depth_and_schema_semantics_are_checked_before_provider_startup() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let capable = ScriptedProvider::new("capable");
    rt.subagents()
        .register_provider(capable.clone())
        .await
        .unwrap()
        .keep();
    let error = subagents::seam::depth::parse_max_depth(&json!(-1)).unwrap_err();
    assert!(error.message().contains("non-negative safe integer"));
    let error = rt
        .subagents()
        .start(
            "capable",
            SubagentStartRequest::new(parent.agent(), text("x")).max_depth(1 << 60),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidMaxDepth);
    let error = rt
        .subagents()
        .start(
            "capable",
            SubagentStartRequest::new(parent.agent(), text("x"))
                .output_schema(json!({"type": "string"})),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnsupportedSchema);
    assert_eq!(capable.start_count(), 0);
    subagents::seam::depth::check_max_depth(None).unwrap();
}

// SPAWN-17 FORK-08
#[test]
fn the_in_process_providers_advertise_every_capability() {
    assert_eq!(
        subagents::SpawnInProcess::default().capabilities(),
        SubagentCapabilities::ALL
    );
    assert_eq!(
        subagents::ForkInProcess::default().capabilities(),
        SubagentCapabilities::ALL
    );
    assert!(!subagents::SpawnInProcess::default().inherits_parent_context());
    assert!(subagents::ForkInProcess::default().inherits_parent_context());
}

// SVC-10
#[actix_rt::test]
async fn lifecycle_is_published_only_after_the_provider_started_and_keeps_the_parent_scope() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let other = root(&rt).await;
    let (start_gate, result_gate) = (Gate::new(), Gate::new());
    let provider = ScriptedProvider::new("slow")
        .gated_start(&start_gate)
        .gated(&result_gate);
    rt.subagents()
        .register_provider(provider)
        .await
        .unwrap()
        .keep();
    let scoped = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let elsewhere = SeamRecorder::new(&rt, EventScope::Key(other.agent().id()));
    let starting = tokio::spawn(
        rt.subagents()
            .start("slow", SubagentStartRequest::new(parent.agent(), text("x"))),
    );
    within("the provider start", start_gate.reached()).await;
    assert!(
        scoped.events().is_empty(),
        "nothing before the provider's start completes"
    );
    start_gate.release();
    let run = within("the start", starting).await.unwrap().unwrap();
    assert_eq!(scoped.names(), ["subagent/start"]);
    result_gate.release();
    run.result().await.unwrap();
    scoped.wait_for_count(2).await;
    let events = scoped.events();
    let (SubagentEvent::Start(start), SubagentEvent::End(end)) = (&events[0], &events[1]) else {
        panic!("start then end, got {events:?}");
    };
    assert_eq!(start.run_id, end.info.run_id, "one run id for the pair");
    assert_eq!(start.parent, parent.agent().id());
    assert!(
        elsewhere.events().is_empty(),
        "another parent's listener sees nothing"
    );
    run.dispose().await.unwrap();
}

// SVC-11
#[actix_rt::test]
async fn repeated_child_ids_still_get_distinct_run_ids() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let id = subagents::SessionId::new();
    rt.subagents()
        .register_provider(ScriptedProvider::new("same").fixed_id(id))
        .await
        .unwrap()
        .keep();
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    for _ in 0..2 {
        let run = start_run(&rt, "same", parent.agent(), "x").await;
        assert_eq!(run.id(), id);
        run.dispose().await.unwrap();
    }
    recorder.wait_for_count(4).await;
    let starts: Vec<_> = recorder
        .events()
        .iter()
        .filter_map(start_info)
        .map(|i| i.run_id)
        .collect();
    assert_eq!(starts.len(), 2);
    assert_ne!(starts[0], starts[1], "one child id, two runs");
    let ends: Vec<_> = recorder
        .events()
        .into_iter()
        .filter_map(|event| match event {
            subagents::SubagentEvent::End(end) => Some(end.info.run_id),
            _ => None,
        })
        .collect();
    assert_eq!(ends, starts, "each end names its own start's run");
}

// SVC-12
#[actix_rt::test]
async fn a_failed_provider_start_emits_no_lifecycle() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let failing = ScriptedProvider::new("broken")
        .fail_start(SubagentError::new(ErrorCode::StoreIo, "setup rolled back"));
    rt.subagents()
        .register_provider(failing)
        .await
        .unwrap()
        .keep();
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    let error = rt
        .subagents()
        .start(
            "broken",
            SubagentStartRequest::new(parent.agent(), text("x")),
        )
        .await
        .unwrap_err();
    assert!(error.message().contains("setup rolled back"));
    assert!(recorder.events().is_empty());
}

async fn end_of(
    rt: &subagents::Runtime,
    provider: ScriptedProvider,
) -> (
    subagents::seam::SubagentRunEndInfo,
    subagents::Result<subagents::SubagentResult>,
) {
    let parent = root(rt).await;
    rt.subagents()
        .register_provider(provider)
        .await
        .unwrap()
        .keep();
    let recorder = SeamRecorder::new(rt, EventScope::Key(parent.agent().id()));
    let run = start_run(rt, "p", parent.agent(), "x").await;
    let result = run.result().await;
    recorder.wait_for_count(2).await;
    let Some(SubagentEvent::End(end)) = recorder.events().pop() else {
        panic!("the second event is the end");
    };
    run.dispose().await.unwrap();
    (end, result)
}

// SVC-13
#[actix_rt::test]
async fn the_end_event_carries_the_outcome_and_maps_a_failed_result_to_error() {
    let rt = memory_runtime(&ScriptedModel::new());
    let (end, _) = end_of(
        &rt,
        ScriptedProvider::new("p").reply(text("answer"), StopReason::Completed),
    )
    .await;
    assert_eq!(end.info.provider, "p");
    assert_eq!(end.last_assistant_message, Some(text("answer")));
    assert_eq!(end.stop_reason, StopReason::Completed);

    let rt = memory_runtime(&ScriptedModel::new());
    let (end, _) = end_of(
        &rt,
        ScriptedProvider::new("p").reply(vec![], StopReason::Completed),
    )
    .await;
    assert_eq!(
        end.last_assistant_message, None,
        "an empty output is omitted"
    );

    let rt = memory_runtime(&ScriptedModel::new());
    let failing =
        ScriptedProvider::new("p").fail_result(SubagentError::new(ErrorCode::StoreIo, "transport"));
    let (end, result) = end_of(&rt, failing).await;
    assert!(result.is_err(), "the run's result still fails");
    assert_eq!(end.stop_reason, StopReason::Error);
    assert_eq!(end.last_assistant_message, None);
}

// SVC-14
#[actix_rt::test]
async fn provider_removed_listener_failures_are_contained() {
    let rt = memory_runtime(&ScriptedModel::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let bus = rt.subagents().events();
    let _a = bus.subscribe(EventScope::All, |e: &SubagentEvent| -> () {
        if matches!(e, SubagentEvent::ProviderRemoved(_)) {
            panic!("sync boom")
        }
    });
    let _b = bus.subscribe(EventScope::All, |e: &SubagentEvent| match e {
        SubagentEvent::ProviderRemoved(_) => Err("async boom"),
        _ => Ok(()),
    });
    let _c = bus.subscribe(EventScope::All, move |e: &SubagentEvent| {
        if let SubagentEvent::ProviderRemoved(name) = e {
            sink.lock().unwrap().push(name.clone());
        }
    });
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    rt.subagents()
        .register_provider(ScriptedProvider::new("gone"))
        .await
        .unwrap()
        .remove();
    recorder
        .wait_until("the removal", |events| {
            events
                .iter()
                .any(|e| matches!(e, SubagentEvent::ProviderRemoved(_)))
        })
        .await;
    assert_eq!(*seen.lock().unwrap(), ["gone"]);
}

// Seed 000: per-listener containment of subagent/start and subagent/end.
#[actix_rt::test]
async fn a_panicking_start_or_end_listener_starves_no_later_listener() {
    let model = ScriptedModel::with_script([ScriptStep::text("child answer")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let starts = Arc::new(Mutex::new(0));
    let ends = Arc::new(Mutex::new(Vec::new()));
    let bus = rt.subagents().events();
    let _first_start = bus.subscribe(EventScope::All, |e: &SubagentEvent| -> () {
        if matches!(e, SubagentEvent::Start(_)) {
            panic!("bad start subscriber")
        }
    });
    let sink = Arc::clone(&starts);
    let _second_start = bus.subscribe(EventScope::All, move |e: &SubagentEvent| {
        if matches!(e, SubagentEvent::Start(_)) {
            *sink.lock().unwrap() += 1;
        }
    });
    let _first_end = bus.subscribe(EventScope::All, |e: &SubagentEvent| -> () {
        if matches!(e, SubagentEvent::End(_)) {
            panic!("bad end subscriber")
        }
    });
    let sink = Arc::clone(&ends);
    let _second_end = bus.subscribe(EventScope::All, move |e: &SubagentEvent| {
        if let SubagentEvent::End(end) = e {
            sink.lock().unwrap().push(end.stop_reason.clone());
        }
    });
    let recorder = SeamRecorder::new(&rt, EventScope::All);
    let run = start_run(&rt, "spawn", parent.agent(), "go").await;
    assert_eq!(
        *starts.lock().unwrap(),
        1,
        "the second start listener observed the start"
    );
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed,
        "the run was not stranded"
    );
    recorder.wait_for_count(2).await;
    assert_eq!(
        *ends.lock().unwrap(),
        [StopReason::Completed],
        "the second end listener observed the settle"
    );
    run.dispose().await.unwrap();
}

// SPAWN-02 FORK-01
#[actix_rt::test]
async fn subagent_start_names_the_published_child() {
    for provider in ["spawn", "fork"] {
        let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
        let rt = seam_runtime(&model).await;
        let parent = root(&rt).await;
        // Every agent published so far, and whether each start named an already published one.
        let published = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&published);
        let _created = rt
            .events()
            .subscribe(EventScope::All, move |e: &subagents::AgentEvent| {
                if e.kind == subagents::AgentEventKind::Created {
                    sink.lock().unwrap().push(e.agent);
                }
            });
        let checks = Arc::new(Mutex::new(Vec::new()));
        let (seen, record) = (Arc::clone(&published), Arc::clone(&checks));
        let _start =
            rt.subagents()
                .events()
                .subscribe(EventScope::All, move |e: &SubagentEvent| {
                    if let SubagentEvent::Start(info) = e {
                        record
                            .lock()
                            .unwrap()
                            .push(seen.lock().unwrap().contains(&info.id));
                    }
                });
        let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
        let run = start_run(&rt, provider, parent.agent(), "go").await;
        let infos: Vec<_> = recorder
            .events()
            .iter()
            .filter_map(start_info)
            .cloned()
            .collect();
        assert_eq!(
            infos.len(),
            1,
            "{provider}: the start was emitted before start returned"
        );
        assert_eq!(infos[0].id, run.id());
        assert!(infos[0].local);
        assert_eq!(infos[0].provider, provider);
        assert!(
            rt.agents().get(infos[0].id).await.is_some(),
            "{provider}: the child is published"
        );
        run.dispose().await.unwrap();
    }
}
