//! Fork seeding: the balanced completed-turn prefix a fork child inherits, and what it reads as
//! its own output.

use serde_json::json;
use subagents::seam::child_run::completed_turn_prefix;
use subagents::seam::{ContinuableCreateRequest, SubagentProvider};
use subagents::testing::{ScriptStep, ScriptedModel};
use subagents::{EventKind, ForkInProcess, StopReason, SubagentStartRequest};
use tokio_util::sync::CancellationToken;

use crate::support::{root, run_prompt, seam_runtime, start_run, text, turn_ends, user_texts};

// SPAWN-04
#[actix_rt::test]
async fn a_spawned_child_does_not_inherit_the_parent_conversation() {
    let model = ScriptedModel::with_script([ScriptStep::text("parent"), ScriptStep::text("child")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "parent question").await;
    let run = start_run(&rt, "spawn", parent.agent(), "own prompt").await;
    run.result().await.unwrap();
    let log = run.local_agent().unwrap().log().events();
    assert_eq!(user_texts(&log)[0], "own prompt");
    assert_eq!(model.requests()[1].messages[0].text(), "own prompt");
    run.dispose().await.unwrap();
}

// FORK-02
#[actix_rt::test]
async fn a_parent_without_a_completed_turn_forks_a_fresh_child() {
    let model = ScriptedModel::with_script([ScriptStep::text("fresh child")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "fork", parent.agent(), "go").await;
    assert_eq!(run.result().await.unwrap().output, text("fresh child"));
    let child = run.local_agent().unwrap().clone();
    assert_eq!(turn_ends(&child.log().events()).len(), 1);
    assert_eq!(child.header().seed_length, None);
    run.dispose().await.unwrap();
}

// FORK-03 FORK-04
#[actix_rt::test]
async fn every_completed_parent_turn_is_seeded() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("one"),
        ScriptStep::text("two"),
        ScriptStep::text("child answer"),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    run_prompt(parent.agent(), "second").await;
    let parent_log = parent.agent().log().events();
    let run = start_run(&rt, "fork", parent.agent(), "fork task").await;
    assert_eq!(run.result().await.unwrap().output, text("child answer"));
    let child = run.local_agent().unwrap().clone();
    let n = parent_log.len();
    assert_eq!(child.header().seed_length, Some(u64::try_from(n).unwrap()));
    assert_eq!(child.header().parent_session, Some(parent.agent().id()));
    let child_log = child.log().events();
    assert!(child_log.len() > n);
    assert_eq!(
        child_log[..n],
        parent_log[..],
        "the prefix is the parent's log exactly"
    );
    assert!(matches!(child_log[n - 1].kind, EventKind::TurnEnd { .. }));
    assert_eq!(turn_ends(&child_log[..n]).len(), 2);
    assert!(user_texts(&child_log[..n]).contains(&"first".to_owned()));
    let request = &model.requests()[2];
    assert_eq!(
        request.messages[0].text(),
        "first",
        "the child's model sees the inherited history"
    );
    run.dispose().await.unwrap();
}

// FORK-05
#[actix_rt::test]
async fn forking_mid_turn_leaves_the_open_turn_out() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("done"),
        ScriptStep::Hang,
        ScriptStep::text("child"),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    parent
        .agent()
        .followup(text("second (hangs)"), subagents::MessageSource::User)
        .await
        .unwrap();
    let run = start_run(&rt, "fork", parent.agent(), "fork now").await;
    assert_eq!(
        run.result().await.unwrap().stop_reason,
        StopReason::Completed
    );
    assert_eq!(
        turn_ends(&run.local_agent().unwrap().log().events()).len(),
        2,
        "one seeded, one own"
    );
    run.dispose().await.unwrap();
    parent.dispose().await.unwrap();
}

// FORK-07
#[actix_rt::test]
async fn the_seeded_parent_output_is_never_the_child_output() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("parent stale"),
        ScriptStep::Chunks(vec![subagents::StreamChunk::Finish {
            reason: subagents::model::FinishReason::Stop,
        }]),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    let run = start_run(&rt, "fork", parent.agent(), "say nothing").await;
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.output),
        (StopReason::Completed, vec![])
    );
    run.dispose().await.unwrap();
}

// FORK-10
#[actix_rt::test]
async fn fork_prepares_a_continuable_seed_from_completed_turns_only() {
    let model = ScriptedModel::with_script([ScriptStep::text("one")]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    let fork = ForkInProcess::default();
    let prepare = |parent: &subagents::AgentRef| ContinuableCreateRequest {
        session_id: subagents::SessionId::new(),
        parent: parent.clone(),
        cancel: CancellationToken::new(),
    };
    let before = fork
        .continuable()
        .unwrap()
        .prepare_continuable(prepare(parent.agent()))
        .await
        .unwrap();
    assert_eq!(before.seed, None);
    run_prompt(parent.agent(), "first").await;
    let after = fork
        .continuable()
        .unwrap()
        .prepare_continuable(prepare(parent.agent()))
        .await
        .unwrap();
    let seed = after.seed.expect("a seed after a completed turn");
    assert!(matches!(
        seed.events().last().unwrap().kind,
        EventKind::TurnEnd { .. }
    ));
    let reference = seed
        .reference()
        .expect("a fork's seed is stored by reference");
    assert_eq!(reference.session, parent.agent().id());
    assert_eq!(reference.length, u64::try_from(seed.len()).unwrap());
    assert!(seed
        .events()
        .iter()
        .enumerate()
        .all(|(i, e)| e.seq == u64::try_from(i).unwrap()));
}

// DRV-08
#[actix_rt::test]
async fn the_driver_reads_only_the_child_owned_output_of_a_seeded_child() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("parent answer"),
        ScriptStep::text("child answer"),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    let seed = parent.agent().log().events();
    let run = start_run(&rt, "fork", parent.agent(), "child task").await;
    assert_eq!(run.result().await.unwrap().output, text("child answer"));
    let child = run.local_agent().unwrap().clone();
    assert_eq!(
        child.header().seed_length,
        Some(u64::try_from(seed.len()).unwrap())
    );
    assert_eq!(child.log().events()[..seed.len()], seed[..]);
    let prefix = completed_turn_prefix(parent.agent().log());
    assert_eq!(
        prefix
            .events()
            .iter()
            .map(|e| (**e).clone())
            .collect::<Vec<_>>(),
        seed
    );
    run.dispose().await.unwrap();
}

// FORK-06 (structured output through the fork provider)
#[actix_rt::test]
async fn a_seeded_fork_child_captures_structured_output() {
    let model = ScriptedModel::with_script([
        ScriptStep::text("parent"),
        ScriptStep::tool_call("c1", "structured_output", json!({"answer": 9})),
    ]);
    let rt = seam_runtime(&model).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    let schema = json!({"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]});
    let run = rt
        .subagents()
        .start(
            "fork",
            SubagentStartRequest::new(parent.agent(), text("answer")).output_schema(schema),
        )
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(
        (result.stop_reason, result.structured),
        (StopReason::Completed, Some(json!({"answer": 9})))
    );
    run.dispose().await.unwrap();
}
