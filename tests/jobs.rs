//! Background jobs: the registry, the job tools, and the `subagent` tool's background one-shot
//! route (`providers-and-tools.md` §2.1 test 27 and 29).

use serde_json::{json, Value};
use subagents::jobs::tools::{install_job_tools, JobToolsConfig, JOBS_PLUGIN};
use subagents::jobs::{JobHooks, JobOutcome, JobStatus, KillOutcome};
use subagents::testing::{Gate, ScriptStep, ScriptedModel, ScriptedProvider};
use subagents::tools::{execute, install_subagent_tool, SubagentToolConfig, ToolLayer};
use subagents::{
    AgentHandle, CallId, ContentBlock, ErrorCode, EventKind, MessageSource, Runtime, StopReason,
    SubagentError, ToolCtx,
};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, root, run_prompt, seam_runtime, tool_error_codes, tool_results};

/// A runtime with `provider` (named `mock`), a `subagent` tool on it, and (when `jobs`) the job tools; the
/// parent's first turn makes one background delegation.
async fn background_fixture(provider: &ScriptedProvider, jobs: bool) -> (Runtime, AgentHandle) {
    let model = ScriptedModel::with_script([ScriptStep::tool_call(
        "c1",
        "subagent",
        json!({"description": "background task", "prompt": "work", "run_in_background": true}),
    )]);
    model.set_fallback(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    rt.subagents()
        .register_provider(provider.clone())
        .await
        .unwrap()
        .keep();
    install_subagent_tool(&rt, SubagentToolConfig::new("mock"))
        .await
        .unwrap()
        .keep();
    if jobs {
        install_job_tools(&rt, JobToolsConfig::default())
            .unwrap()
            .keep();
    }
    let parent = root(&rt).await;
    (rt, parent)
}

/// Runs `tool` with `arguments` as `caller` would, outside any turn.
async fn call(rt: &Runtime, caller: &AgentHandle, tool: &str, arguments: Value) -> (bool, String) {
    let ctx = ToolCtx::for_agent(
        caller.agent(),
        CallId::new("direct"),
        tool.into(),
        CancellationToken::new(),
    );
    let result = execute(
        &ToolLayer::default(),
        rt.tools(),
        ctx,
        &arguments.to_string(),
    )
    .await;
    let text = result
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect();
    (result.is_error, text)
}

// TOOL-SUB-29
#[actix_rt::test]
async fn without_a_job_controller_a_background_call_starts_nothing() {
    let provider = ScriptedProvider::new("mock");
    let (_rt, parent) = background_fixture(&provider, false).await;
    let events = run_prompt(parent.agent(), "go").await;
    assert_eq!(tool_error_codes(&events), ["JOBS_UNAVAILABLE"]);
    assert!(tool_results(&events)[0]
        .1
        .contains("no job controller serves this agent"));
    assert_eq!(provider.start_count(), 0);
}

// TOOL-SUB-27
#[actix_rt::test]
async fn a_background_delegation_is_a_job_whose_output_reads_back_the_same_every_time() {
    let provider = ScriptedProvider::new("mock").reply(
        vec![ContentBlock::text("background answer")],
        StopReason::Completed,
    );
    let (rt, parent) = background_fixture(&provider, true).await;
    let events = run_prompt(parent.agent(), "go").await;
    assert_eq!(
        tool_results(&events),
        [(
            false,
            "started background subagent job subagent-1".to_owned()
        )]
    );
    let read = json!({"job_id": "subagent-1", "wait": true});
    let expected = (false, "background answer\n[status: completed]".to_owned());
    assert_eq!(
        call(&rt, &parent, "job_output", read.clone()).await,
        expected
    );
    assert_eq!(call(&rt, &parent, "job_output", read).await, expected);
    assert_eq!(provider.dispose_count(), 1);
    let listed = call(&rt, &parent, "job_list", json!({})).await;
    assert_eq!(
        listed,
        (
            false,
            "subagent-1 [subagent] completed — background task".to_owned()
        )
    );
}

// TOOL-SUB-27
#[actix_rt::test]
async fn an_unread_completion_wakes_its_idle_owner_with_a_notice() {
    let provider = ScriptedProvider::new("mock");
    let (_rt, parent) = background_fixture(&provider, true).await;
    run_prompt(parent.agent(), "go").await;
    let agent = parent.agent().clone();
    let expected = "background job subagent-1 (subagent: background task) finished [status: completed]. Read its output with job_output.";
    eventually("the completion notice", || {
        agent.log().events().iter().any(|event| {
            matches!(&event.kind, EventKind::UserMessage(message)
                if message.source == MessageSource::Plugin { plugin: JOBS_PLUGIN.into() }
                    && message.text() == expected)
        })
    })
    .await;
    // It opened a turn of its own on the idle owner.
    crate::support::idle_after_turns(&agent, 2).await;
}

// TOOL-SUB-27
#[actix_rt::test]
async fn a_failed_or_refused_background_run_fails_its_job_with_the_reason() {
    let failing = ScriptedProvider::new("mock").reply(vec![], StopReason::Error);
    let (rt, parent) = background_fixture(&failing, true).await;
    run_prompt(parent.agent(), "go").await;
    assert_eq!(
        call(
            &rt,
            &parent,
            "job_output",
            json!({"job_id": "subagent-1", "wait": true})
        )
        .await,
        (false, "(no new output)\n[status: failed, error]".to_owned())
    );
    let refusing = ScriptedProvider::new("mock")
        .fail_start(SubagentError::new(ErrorCode::InvalidArgs, "setup failed"));
    let (rt, parent) = background_fixture(&refusing, true).await;
    run_prompt(parent.agent(), "go").await;
    assert_eq!(
        call(
            &rt,
            &parent,
            "job_output",
            json!({"job_id": "subagent-1", "wait": true})
        )
        .await,
        (
            false,
            "(no new output)\n[status: failed, Error: setup failed]".to_owned()
        )
    );
}

// TOOL-SUB-27
#[actix_rt::test]
async fn a_job_killed_while_its_start_is_pending_settles_killed() {
    let gate = Gate::new();
    let provider = ScriptedProvider::new("mock").gated_start(&gate);
    let (rt, parent) = background_fixture(&provider, true).await;
    run_prompt(parent.agent(), "go").await;
    gate.reached().await;
    assert_eq!(
        call(
            &rt,
            &parent,
            "job_kill",
            json!({"job_id": "subagent-1", "reason": "superseded"})
        )
        .await,
        (false, "requested cancellation of job subagent-1".to_owned())
    );
    assert!(
        provider.requests()[0].request.cancel.is_cancelled(),
        "the kill reached the provider"
    );
    gate.release();
    assert_eq!(
        call(
            &rt,
            &parent,
            "job_output",
            json!({"job_id": "subagent-1", "wait": true})
        )
        .await,
        (false, "(no new output)\n[status: killed]".to_owned())
    );
    assert_eq!(
        call(&rt, &parent, "job_kill", json!({"job_id": "subagent-1"})).await,
        (
            false,
            "job subagent-1 had already finished [status: killed]".to_owned()
        )
    );
}

#[actix_rt::test]
async fn a_job_is_reachable_only_by_its_owner_and_unknown_ids_are_errors() {
    let provider = ScriptedProvider::new("mock");
    let (rt, parent) = background_fixture(&provider, true).await;
    run_prompt(parent.agent(), "go").await;
    let stranger = root(&rt).await;
    let (is_error, text) = call(
        &rt,
        &stranger,
        "job_output",
        json!({"job_id": "subagent-1"}),
    )
    .await;
    assert!(
        is_error && text.contains("belongs to another session"),
        "{text}"
    );
    assert_eq!(
        call(&rt, &stranger, "job_list", json!({})).await,
        (false, "(no background jobs)".to_owned())
    );
    let (is_error, text) = call(&rt, &parent, "job_output", json!({"job_id": "subagent-9"})).await;
    assert!(
        is_error && text.contains("unknown job subagent-9"),
        "{text}"
    );
    let (is_error, text) = call(&rt, &parent, "job_output", json!({"job_id": ""})).await;
    assert!(is_error && text.contains("invalid job_id"), "{text}");
}

#[actix_rt::test]
async fn a_timed_out_wait_leaves_the_job_running_and_ids_count_per_kind() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    install_job_tools(&rt, JobToolsConfig::default())
        .unwrap()
        .keep();
    let owner = root(&rt).await;
    let release = Gate::new();
    let held = release.clone();
    let cancelled = CancellationToken::new();
    let on_kill = cancelled.clone();
    let first = rt
        .jobs()
        .start("bash", "sleep", owner.agent(), move || JobHooks {
            cancel: Box::new(move |_| on_kill.cancel()),
            done: Box::pin(async move {
                held.pass().await;
                JobOutcome {
                    status: JobStatus::Completed,
                    detail: None,
                    output: Some("slept\n".into()),
                }
            }),
        })
        .unwrap();
    assert_eq!(first, "bash-1");
    let timed_out = call(
        &rt,
        &owner,
        "job_output",
        json!({"job_id": "bash-1", "wait": true, "timeout_ms": 5}),
    )
    .await;
    assert_eq!(
        timed_out,
        (false, "(no new output)\n[status: running]".to_owned())
    );
    release.release();
    let done = call(
        &rt,
        &owner,
        "job_output",
        json!({"job_id": "bash-1", "wait": true}),
    )
    .await;
    assert_eq!(done, (false, "slept\n[status: completed]".to_owned()));
    assert!(!cancelled.is_cancelled());
    assert_eq!(
        rt.jobs().kill("bash-1", owner.agent().id(), None).unwrap(),
        KillOutcome::AlreadyFinished
    );
    let second = rt
        .jobs()
        .start("bash", "echo", owner.agent(), || JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async {
                JobOutcome {
                    status: JobStatus::Completed,
                    detail: None,
                    output: None,
                }
            }),
        })
        .unwrap();
    assert_eq!(second, "bash-2");
    let bad = install_job_tools(
        &rt,
        JobToolsConfig {
            wait_timeout: std::time::Duration::from_secs(60),
            max_wait_timeout: std::time::Duration::from_secs(1),
            ..JobToolsConfig::default()
        },
    );
    assert_eq!(bad.unwrap_err().code(), ErrorCode::InvalidArgs);
}

/// A job of `owner` held until `gate` opens, then completed with `output`.
fn held_job(rt: &Runtime, owner: &AgentHandle, gate: &Gate, output: &str) -> String {
    let held = gate.clone();
    let output = output.to_owned();
    rt.jobs()
        .start("bash", "held", owner.agent(), move || JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async move {
                held.pass().await;
                JobOutcome {
                    status: JobStatus::Completed,
                    detail: None,
                    output: Some(output),
                }
            }),
        })
        .unwrap()
}

fn notices(agent: &subagents::AgentRef) -> Vec<String> {
    agent
        .log()
        .events()
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::UserMessage(message)
                if message.source
                    == (MessageSource::Plugin {
                        plugin: JOBS_PLUGIN.into(),
                    }) =>
            {
                Some(message.text())
            }
            _ => None,
        })
        .collect()
}

#[actix_rt::test]
async fn a_wait_dropped_after_the_settlement_leaves_the_notice_owed() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    install_job_tools(&rt, JobToolsConfig::default())
        .unwrap()
        .keep();
    let owner = root(&rt).await;
    let gate = Gate::new();
    let id = held_job(&rt, &owner, &gate, "late");
    let jobs = rt.jobs().clone();
    let never = CancellationToken::new();
    let mut wait = Box::pin(jobs.wait(
        &id,
        owner.agent().id(),
        std::time::Duration::from_secs(60),
        &never,
    ));
    // Polled once: the wait is registered, so the settlement leaves the notice to it.
    assert!(futures::poll!(wait.as_mut()).is_pending());
    gate.release();
    let owner_id = owner.agent().id();
    eventually("the job settles", || {
        jobs.get(&id, owner_id)
            .is_ok_and(|job| job.status.is_terminal())
    })
    .await;
    assert!(
        notices(owner.agent()).is_empty(),
        "the wait may still return it"
    );
    // The caller goes away without the result: the notice is sent after all.
    drop(wait);
    let agent = owner.agent().clone();
    eventually("the owed notice", || notices(&agent).len() == 1).await;
}

// A completion notice is sent once: a wait on a job whose notice already went out, cut short
// by its cancellation, owes nothing more.
#[actix_rt::test]
async fn a_notified_job_is_never_notified_again() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let _controller = rt.jobs().attach_controller();
    let (told, mut notified) = tokio::sync::mpsc::unbounded_channel();
    let _listener = rt.jobs().on_job_done(std::sync::Arc::new(move |job, _| {
        let _ = told.send(job.id.clone());
    }));
    let owner = root(&rt).await;
    let id = finished_job(&rt, &owner);
    assert_eq!(notified.recv().await, Some(id.clone()));
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    // Each wait finds both the settlement and the cancellation ready: either way it returns,
    // nothing more is owed.
    for _ in 0..32 {
        let _ = wait_job(&rt, &id, &owner, &cancelled).await;
    }
    // The listener runs synchronously inside the registry: anything owed was told already.
    assert!(notified.try_recv().is_err(), "a second notice");
}

#[actix_rt::test]
async fn removed_job_tools_stop_notices_and_refuse_new_jobs() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let tools = install_job_tools(&rt, JobToolsConfig::default()).unwrap();
    let owner = root(&rt).await;
    let gate = Gate::new();
    let first = held_job(&rt, &owner, &gate, "quiet");
    tools.remove();
    assert!(rt.tools().get("job_output").is_none());
    gate.release();
    let (jobs, id) = (rt.jobs().clone(), owner.agent().id());
    eventually("the first job settles with no tools installed", || {
        jobs.get(&first, id)
            .is_ok_and(|job| job.status.is_terminal())
    })
    .await;
    let refused = rt
        .jobs()
        .start("bash", "later", owner.agent(), unreachable_hooks)
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::JobsUnavailable);
    // A fresh installation's notices start from its own listener only.
    install_job_tools(&rt, JobToolsConfig::default())
        .unwrap()
        .keep();
    let second = Gate::new();
    held_job(&rt, &owner, &second, "counted");
    second.release();
    let agent = owner.agent().clone();
    eventually("one notice for the new job", || {
        notices(&agent).iter().any(|n| n.contains("bash-2"))
    })
    .await;
    assert_eq!(
        notices(owner.agent()).len(),
        1,
        "no notice from the removed tools"
    );
}

fn unreachable_hooks() -> JobHooks {
    JobHooks {
        cancel: Box::new(|_| {}),
        done: Box::pin(async {
            JobOutcome {
                status: JobStatus::Failed,
                detail: Some("a refused job never runs".into()),
                output: None,
            }
        }),
    }
}

#[actix_rt::test]
async fn bad_job_arguments_are_typed_errors_and_a_huge_timeout_is_just_the_cap() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    install_job_tools(&rt, JobToolsConfig::default())
        .unwrap()
        .keep();
    let owner = root(&rt).await;
    let gate = Gate::new();
    let id = held_job(&rt, &owner, &gate, "done");
    gate.release();
    let huge = call(
        &rt,
        &owner,
        "job_output",
        json!({"job_id": id, "wait": true, "timeout_ms": 1e300}),
    )
    .await;
    assert_eq!(huge, (false, "done\n[status: completed]".to_owned()));
    for arguments in [
        json!({"job_id": id, "wait": "yes"}),
        json!({"job_id": id, "wait": true, "timeout_ms": "soon"}),
        json!({"job_id": id, "wait": true, "timeout_ms": -1}),
        json!({"job_id": 7}),
    ] {
        let (is_error, text) = call(&rt, &owner, "job_output", arguments.clone()).await;
        assert!(is_error, "{arguments} was accepted: {text}");
    }
    let (is_error, _) = call(&rt, &owner, "job_kill", json!({"job_id": id, "reason": 3})).await;
    assert!(is_error);
}

/// Waits (up to a minute) for `owner`'s job `id` to end, as the job tools do.
async fn wait_job(
    rt: &Runtime,
    id: &str,
    owner: &AgentHandle,
    cancel: &CancellationToken,
) -> subagents::Result<subagents::jobs::JobSnapshot> {
    rt.jobs()
        .wait(
            id,
            owner.agent().id(),
            std::time::Duration::from_secs(60),
            cancel,
        )
        .await
}

/// A job of `owner` that completes at once.
fn finished_job(rt: &Runtime, owner: &AgentHandle) -> String {
    rt.jobs()
        .start("bash", "quick", owner.agent(), || JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async {
                JobOutcome {
                    status: JobStatus::Completed,
                    detail: None,
                    output: Some("done".into()),
                }
            }),
        })
        .unwrap()
}

// A long-running host starts job after job: the registry keeps only the most recently ended
// jobs of each owner and overall, and never forgets a running one.
#[actix_rt::test]
async fn a_long_run_of_jobs_keeps_the_registry_flat() {
    use subagents::jobs::{ENDED_JOBS, ENDED_JOBS_PER_OWNER};
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let rt = seam_runtime(&model).await;
    let _controller = rt.jobs().attach_controller();
    let owners_needed = ENDED_JOBS / ENDED_JOBS_PER_OWNER + 8;
    let mut owners = Vec::new();
    for _ in 0..owners_needed {
        owners.push(root(&rt).await);
    }
    let gate = Gate::new();
    let running = held_job(&rt, &owners[0], &gate, "late");
    let never = CancellationToken::new();
    let mut first = None;
    let mut last_ids = Vec::new();
    for owner in &owners {
        let mut ids = Vec::new();
        for _ in 0..2 * ENDED_JOBS_PER_OWNER {
            let id = finished_job(&rt, owner);
            let ended = wait_job(&rt, &id, owner, &never).await.unwrap();
            assert_eq!(ended.status, JobStatus::Completed);
            ids.push(id);
        }
        first.get_or_insert_with(|| ids[0].clone());
        last_ids = ids;
    }
    let kept: usize = owners
        .iter()
        .map(|owner| rt.jobs().list(owner.agent().id()).len())
        .sum();
    // Every owner's ended jobs were cut to its share, the total to the overall bound (the
    // running job aside).
    assert!(kept <= ENDED_JOBS + 1, "{kept} jobs kept");
    let mut newest: Vec<String> = rt
        .jobs()
        .list(owners[owners_needed - 1].agent().id())
        .into_iter()
        .map(|job| job.id)
        .collect();
    let mut expected = last_ids[ENDED_JOBS_PER_OWNER..].to_vec();
    newest.sort();
    expected.sort();
    assert_eq!(newest, expected, "the last owner keeps its newest jobs");
    let forgotten = rt
        .jobs()
        .get(first.as_deref().unwrap(), owners[0].agent().id())
        .unwrap_err();
    assert!(forgotten.message().contains("unknown job"), "{forgotten}");
    // The running job outlived every cut, and settles as usual.
    let snapshot = rt.jobs().get(&running, owners[0].agent().id()).unwrap();
    assert_eq!(snapshot.status, JobStatus::Running);
    gate.release();
    let ended = wait_job(&rt, &running, &owners[0], &never).await.unwrap();
    assert_eq!(ended.status, JobStatus::Completed);
    assert_eq!(
        rt.jobs().read(&running, owners[0].agent().id()).unwrap().0,
        "late"
    );
}
