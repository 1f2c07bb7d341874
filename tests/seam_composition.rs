//! The child's composition: the durable descriptor, persona, tool filter, delegated policy and
//! the runtime-context statement.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use subagents::host::{DelegatedPolicy, DelegationPolicy, PromptSection};
use subagents::seam::{DelegationMode, SubagentDescriptor};
use subagents::session::SessionEvent;
use subagents::testing::{ScriptStep, ScriptedModel, ScriptedProvider};
use subagents::{
    EventKind, MessageSource, Runtime, SessionId, StopReason, SubagentStartRequest, Tool,
    ToolFilter, ToolOutput,
};

use crate::support::{
    memory_runtime, root, run_prompt, seam_runtime, seam_runtime_from, start_run, text,
    tool_error_codes,
};

fn descriptor_event(data: Value) -> SessionEvent {
    SessionEvent::new(
        0,
        EventKind::Extension {
            event_type: "subagent/descriptor".into(),
            data,
        },
    )
}

// SVC-04
#[actix_rt::test]
async fn the_provider_receives_a_copy_with_the_one_shot_descriptor() {
    let rt = memory_runtime(&ScriptedModel::new());
    let parent = root(&rt).await;
    let provider = ScriptedProvider::new("p");
    rt.subagents()
        .register_provider(provider.clone())
        .await
        .unwrap()
        .keep();
    let run = start_run(&rt, "p", parent.agent(), "x").await;
    let received = provider.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].descriptor.to_json(),
        json!({"version": 2, "mode": "one-shot", "provider": "p"})
    );
    run.dispose().await.unwrap();
}

// SVC-16
#[test]
fn descriptors_omit_absent_fields_and_fold_back() {
    assert_eq!(SubagentDescriptor::fold::<SessionEvent>(&[]).unwrap(), None);
    let minimal = SubagentDescriptor::one_shot("spawn", None);
    assert_eq!(
        minimal.to_json(),
        json!({"version": 2, "mode": "one-shot", "provider": "spawn"})
    );
    assert_eq!(
        SubagentDescriptor::fold(&[descriptor_event(minimal.to_json())]).unwrap(),
        Some(minimal)
    );
    let labelled = SubagentDescriptor::one_shot("spawn", Some("summarize".into()));
    assert_eq!(labelled.to_json()["label"], "summarize");
    let mut full = SubagentDescriptor::continuable("spawn", "child task");
    full.agent_provider = Some("mock".into());
    full.agent_model = Some("m".into());
    full.persona = Some("You are scoped.".into());
    full.tool_filter = Some(ToolFilter {
        allow: Some(["read".to_owned()].into()),
        deny: ["bash".to_owned()].into(),
    });
    assert_eq!(
        SubagentDescriptor::from_json(&full.to_json()).unwrap(),
        Some(full.clone())
    );
    for filter in [ToolFilter::allow(["read"]), ToolFilter::deny(["bash"])] {
        let mut one = SubagentDescriptor::continuable("spawn", "t");
        one.tool_filter = Some(filter);
        assert_eq!(
            SubagentDescriptor::from_json(&one.to_json()).unwrap(),
            Some(one)
        );
    }
    let mut future = full.to_json();
    future["version"] = json!(4);
    future["mode"] = json!("something-new");
    assert_eq!(
        SubagentDescriptor::from_json(&future).unwrap(),
        None,
        "another version is unclassifiable"
    );
    assert_eq!(full.mode, DelegationMode::Continuable);
}

#[test]
fn a_budget_is_written_as_version_3_and_a_descriptor_without_one_stays_version_2() {
    let plain = SubagentDescriptor::continuable("spawn", "t");
    assert_eq!(plain.to_json()["version"], 2);
    let mut budgeted = SubagentDescriptor::continuable("spawn", "t");
    budgeted.budget = Some(
        subagents::Budget::unlimited()
            .turns(3)
            .tokens(5_000)
            .wall_time(std::time::Duration::from_millis(90_000)),
    );
    let payload = budgeted.to_json();
    assert_eq!(payload["version"], 3);
    assert_eq!(
        payload["budget"],
        json!({"turns": 3, "tokens": 5000, "wallTimeMs": 90000})
    );
    assert_eq!(
        SubagentDescriptor::from_json(&payload).unwrap(),
        Some(budgeted)
    );
    // The seed's version has no budget field, and a limit must be a count.
    let mut seed_format = payload.clone();
    seed_format["version"] = json!(2);
    let error = SubagentDescriptor::from_json(&seed_format).unwrap_err();
    assert!(error.message().contains("unknown field \"budget\""));
    let mut broken = payload;
    broken["budget"] = json!({"turns": 1.5});
    let error = SubagentDescriptor::from_json(&broken).unwrap_err();
    assert_eq!(error.code(), subagents::ErrorCode::InvalidDescriptor);
    assert!(error.message().contains("budget.turns"));
}

// SVC-17
#[test]
fn a_malformed_current_version_descriptor_is_refused_with_its_detail() {
    let one = |extra: Value| {
        let mut base = json!({"version": 2, "mode": "one-shot", "provider": "spawn"});
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        base
    };
    let cont = |extra: Value| {
        let mut base =
            json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "t"});
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        base
    };
    let mut no_provider = one(json!({}));
    no_provider.as_object_mut().unwrap().remove("provider");
    let mut no_label = cont(json!({}));
    no_label.as_object_mut().unwrap().remove("label");
    let rows = [
        (json!("x"), "payload must be an object"),
        (json!(null), "payload must be an object"),
        (json!([]), "payload must be an object"),
        (json!({"mode": "one-shot"}), "version must be a number"),
        (json!({"version": "2"}), "version must be a number"),
        (
            json!({"version": 2}),
            "mode must be \"one-shot\" or \"continuable\"",
        ),
        (
            json!({"version": 2, "mode": "sideways"}),
            "mode must be \"one-shot\" or \"continuable\"",
        ),
        (
            one(json!({"persona": "p"})),
            "payload has unknown field \"persona\"",
        ),
        (one(json!({"label": 7})), "label must be a string"),
        (
            cont(json!({"extra": true})),
            "payload has unknown field \"extra\"",
        ),
        (no_provider, "provider must be a string"),
        (one(json!({"provider": 7})), "provider must be a string"),
        (no_label, "label must be a string"),
        (cont(json!({"label": 7})), "label must be a string"),
        (
            cont(json!({"agentProvider": 7})),
            "agentProvider must be a string",
        ),
        (
            cont(json!({"agentModel": []})),
            "agentModel must be a string",
        ),
        (cont(json!({"persona": {}})), "persona must be a string"),
        (
            cont(json!({"toolFilter": []})),
            "toolFilter must be an object",
        ),
        (
            cont(json!({"toolFilter": {"except": []}})),
            "toolFilter has unknown field \"except\"",
        ),
        (
            cont(json!({"toolFilter": {}})),
            "must declare allow and/or deny",
        ),
        (
            cont(json!({"toolFilter": {"allow": "read"}})),
            "toolFilter.allow must be an array of strings",
        ),
        (
            cont(json!({"toolFilter": {"deny": [7]}})),
            "toolFilter.deny must be an array of strings",
        ),
    ];
    for (payload, detail) in rows {
        let error = SubagentDescriptor::fold(&[descriptor_event(payload.clone())]).unwrap_err();
        assert_eq!(error.code(), subagents::ErrorCode::InvalidDescriptor);
        assert!(
            error.message().contains(detail),
            "{payload}: {}",
            error.message()
        );
    }
}

// The one-shot descriptor sits inside the child's first turn, after the claim, before step 1.
#[actix_rt::test]
async fn a_one_shot_child_logs_its_descriptor_inside_turn_one() {
    let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).label("summarize"),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let log = run.local_agent().unwrap().log().events();
    let kinds: Vec<_> = log.iter().map(|e| e.kind.type_name().to_owned()).collect();
    assert_eq!(
        kinds[..7],
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "subagent/descriptor",
            "step/start",
            "user/message",
            "user/message"
        ]
    );
    assert_eq!(
        SubagentDescriptor::fold(&log).unwrap(),
        Some(SubagentDescriptor::one_shot(
            "spawn",
            Some("summarize".into())
        ))
    );
    assert!(
        log[3].surface_op.is_none(),
        "the model never sees a descriptor"
    );
    run.dispose().await.unwrap();
}

// SPAWN-23
#[actix_rt::test]
async fn a_child_persona_shadows_the_deployment_persona_in_the_child_only() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let builder = Runtime::builder()
        .model("scripted", model.clone())
        .prompt_section(PromptSection::new(
            "deployment:persona",
            0.0,
            "You are the deployment.",
        ))
        .prompt_variable("role", "a strict reviewer");
    let rt = seam_runtime_from(builder).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "parent turn").await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("review")).persona("You are {{role}}."),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let requests = model.requests();
    let parent_system = requests[0].system.clone().unwrap();
    let child_system = requests[1].system.clone().unwrap();
    assert!(
        parent_system.contains("You are the deployment.")
            && !parent_system.contains("strict reviewer")
    );
    assert!(
        child_system.contains("You are a strict reviewer.")
            && !child_system.contains("You are the deployment.")
    );
    run.dispose().await.unwrap();
    let error = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x")).persona("You are {{nobody}}."),
        )
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        subagents::ErrorCode::UnknownPromptVariable,
        "strict interpolation"
    );
}

// SPAWN-24
#[actix_rt::test]
async fn a_tool_filter_hides_denied_tools_and_refuses_their_execution() {
    let model = ScriptedModel::with_script([
        ScriptStep::tool_call("c1", "forbidden_tool", json!({})),
        ScriptStep::text("done"),
    ]);
    let forbidden = Tool::new("forbidden_tool", "", json!({}), |_, _| async {
        Ok(ToolOutput::text("ran!"))
    });
    let allowed = Tool::new("allowed_tool", "", json!({}), |_, _| async {
        Ok(ToolOutput::text("ok"))
    });
    let rt = seam_runtime_from(
        Runtime::builder()
            .model("scripted", model.clone())
            .tool(forbidden)
            .tool(allowed),
    )
    .await;
    let parent = root(&rt).await;
    let run = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x"))
                .tool_filter(ToolFilter::deny(["forbidden_tool"])),
        )
        .await
        .unwrap();
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    let offered: Vec<_> = model.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(offered, ["allowed_tool"]);
    let log = run.local_agent().unwrap().log().events();
    assert_eq!(tool_error_codes(&log), ["UNKNOWN_TOOL"]);
    run.dispose().await.unwrap();
}

// SPAWN-25 DRV-17
#[actix_rt::test]
async fn an_unknown_filter_name_fails_the_start_with_no_orphan() {
    let rt = seam_runtime(&ScriptedModel::new()).await;
    let parent = root(&rt).await;
    let error = rt
        .subagents()
        .start(
            "spawn",
            SubagentStartRequest::new(parent.agent(), text("x"))
                .tool_filter(ToolFilter::deny(["no_such_tool"])),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), subagents::ErrorCode::UnknownTool);
    assert!(
        error
            .message()
            .contains("unknown global tool \"no_such_tool\""),
        "{}",
        error.message()
    );
    assert_eq!(rt.agents().list().await.len(), 1);
    assert_eq!(
        rt.store().unwrap().list().await.unwrap().len(),
        0,
        "no session was stored"
    );
}

/// A deployment whose sandbox override can be switched per parent.
#[derive(Clone, Default)]
struct SwitchablePolicy {
    sandbox: Arc<Mutex<Option<String>>>,
    approvals: bool,
}

impl DelegationPolicy for SwitchablePolicy {
    fn capture(&self, _parent: SessionId) -> DelegatedPolicy {
        DelegatedPolicy {
            sandbox_mode: self.sandbox.lock().unwrap().clone(),
            approval_pinned: self.approvals,
        }
    }
}

/// A seam runtime under `policy`, whose model answers "ok" to every call.
async fn policy_runtime(policy: SwitchablePolicy) -> (Runtime, ScriptedModel) {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let builder = Runtime::builder()
        .model("scripted", model.clone())
        .delegation_policy(policy);
    (seam_runtime_from(builder).await, model)
}

fn policy_types(log: &[SessionEvent]) -> Vec<(u64, String, Value)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::Extension { event_type, data } if event_type != "subagent/descriptor" => {
                Some((e.seq, event_type.to_string(), data.clone()))
            }
            _ => None,
        })
        .collect()
}

// DINH-01 (the recorded policy and the runtime-context statement)
#[actix_rt::test]
async fn the_parent_sandbox_override_and_approval_pin_are_recorded_before_publication() {
    let policy = SwitchablePolicy {
        sandbox: Arc::new(Mutex::new(Some("read-only".into()))),
        approvals: true,
    };
    let (rt, model) = policy_runtime(policy).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    run.result().await.unwrap();
    let child = run.local_agent().unwrap().clone();
    let log = child.log().events();
    assert_eq!(
        policy_types(&log),
        [
            (
                0,
                "sandbox/mode".to_owned(),
                json!({"mode": "read-only", "source": "delegation"})
            ),
            (
                1,
                "approval/policy".to_owned(),
                json!({"policy": "never", "source": "delegation"})
            ),
        ]
    );
    assert_eq!(child.header().seed_length, None);
    let context = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::UserMessage(m) if matches!(&m.source, MessageSource::Plugin { .. }) => {
                Some(m.text())
            }
            _ => None,
        })
        .expect("a runtime-context message");
    for line in [
        "You are a delegated subagent",
        "Current DSH file policy: read-only",
        "Approval prompts are disabled",
    ] {
        assert!(context.contains(line), "{context}");
        assert!(
            !model.requests()[0]
                .system
                .clone()
                .unwrap_or_default()
                .contains(line),
            "not in the system prompt"
        );
    }
    assert!(
        policy_types(&parent.agent().log().events()).is_empty(),
        "the parent log is unchanged"
    );
    run.dispose().await.unwrap();
}

// DINH-02
#[actix_rt::test]
async fn inherited_policy_follows_a_fork_prefix_so_fresh_policy_wins() {
    let policy = SwitchablePolicy {
        sandbox: Arc::new(Mutex::new(Some("read-only".into()))),
        approvals: false,
    };
    let (rt, _) = policy_runtime(policy).await;
    // A parent whose own log records an older sandbox mode before its first turn ends.
    let parent = rt
        .agents()
        .create(subagents::CreateAgent::new().setup(
            |_: &mut subagents::AgentScope, log: &subagents::SessionLog| {
                log.append(EventKind::Extension {
                    event_type: "sandbox/mode".into(),
                    data: json!({"mode": "workspace-write", "source": "user"}),
                })?;
                Ok(None)
            },
        ))
        .await
        .unwrap();
    run_prompt(parent.agent(), "first").await;
    let run = start_run(&rt, "fork", parent.agent(), "x").await;
    run.result().await.unwrap();
    let log = run.local_agent().unwrap().log().events();
    let seed_len =
        usize::try_from(run.local_agent().unwrap().header().seed_length.unwrap()).unwrap();
    assert!(matches!(log[seed_len].kind, EventKind::EndSeed {}));
    let modes = policy_types(&log);
    assert_eq!(
        modes.first().map(|m| m.0),
        Some(0),
        "the seeded mode stays at its seq"
    );
    assert_eq!(
        modes.last().unwrap(),
        &(
            u64::try_from(seed_len + 1).unwrap(),
            "sandbox/mode".to_owned(),
            json!({"mode": "read-only", "source": "delegation"})
        )
    );
    run.dispose().await.unwrap();
}

// DINH-03
#[actix_rt::test]
async fn policy_is_captured_when_the_delegation_is_called() {
    let policy = SwitchablePolicy {
        sandbox: Arc::new(Mutex::new(Some("read-only".into()))),
        approvals: false,
    };
    let switch = Arc::clone(&policy.sandbox);
    let (rt, _) = policy_runtime(policy).await;
    let parent = root(&rt).await;
    let starting = rt.subagents().start(
        "spawn",
        SubagentStartRequest::new(parent.agent(), text("x")),
    );
    *switch.lock().unwrap() = Some("danger-full-access".into());
    let run = starting.await.unwrap();
    let log = run.local_agent().unwrap().log().events();
    assert_eq!(policy_types(&log)[0].2["mode"], "read-only");
    run.dispose().await.unwrap();
}

// DINH-04
#[actix_rt::test]
async fn an_unswitched_sandbox_records_only_the_approval_pin() {
    let policy = SwitchablePolicy {
        sandbox: Arc::default(),
        approvals: true,
    };
    let (rt, _) = policy_runtime(policy).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "x").await;
    let log = run.local_agent().unwrap().log().events();
    assert_eq!(
        policy_types(&log),
        [(
            0,
            "approval/policy".to_owned(),
            json!({"policy": "never", "source": "delegation"})
        )]
    );
    run.dispose().await.unwrap();
}
