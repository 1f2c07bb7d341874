//! The agent registry: create and resume transactions, exact identity, disposal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;
use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentEvent, AgentEventKind, AgentScope, CreateAgent, ErrorCode, EventKind, EventScope,
    MemoryStore, MessageSource, ResumeAgent, Runtime, SessionLog, SessionPersistence,
    SubagentError, Tool, ToolFilter, ToolOutput, TurnEndReason,
};
use tokio_util::sync::CancellationToken;

use crate::support::{run_prompt, text, turn_ends, user_texts};

fn runtime_on(store: Arc<dyn SessionPersistence>, model: &ScriptedModel) -> Runtime {
    Runtime::builder()
        .shared_store(store)
        .model("scripted", model.clone())
        .tool(Tool::new("echo", "", json!({}), |_, _| async {
            Ok(ToolOutput::text("e"))
        }))
        .build()
        .unwrap()
}

/// Counts every `agent/created` the runtime emits.
fn count_created(rt: &Runtime) -> (Arc<Mutex<usize>>, subagents::Subscription) {
    let count = Arc::new(Mutex::new(0));
    let sink = Arc::clone(&count);
    let subscription = rt
        .events()
        .subscribe(EventScope::All, move |e: &AgentEvent| {
            if e.kind == AgentEventKind::Created {
                *sink.lock().unwrap() += 1;
            }
        });
    (count, subscription)
}

async fn assert_nothing_published(
    rt: &Runtime,
    store: &Arc<dyn SessionPersistence>,
    created: &Mutex<usize>,
) {
    assert!(
        rt.agents().list().await.is_empty(),
        "no agent is registered"
    );
    assert!(
        store.list().await.unwrap().is_empty(),
        "no session is stored"
    );
    assert_eq!(*created.lock().unwrap(), 0, "no agent/created fired");
}

#[actix_rt::test]
async fn a_failing_setup_rolls_the_creation_back() {
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &ScriptedModel::new());
    let (created, _sub) = count_created(&rt);
    let unwound = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&unwound);
    let error = rt
        .agents()
        .create(
            CreateAgent::new().setup(move |scope: &mut AgentScope, _: &SessionLog| {
                scope.on_dispose(Box::new(move || flag.store(true, Ordering::SeqCst)));
                scope.register_tool(Tool::new("mine", "", json!({}), |_, _| async {
                    Ok(ToolOutput::default())
                }))?;
                Err(SubagentError::new(
                    ErrorCode::ActivationSetupRevoked,
                    "setup refused",
                ))
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::ActivationSetupRevoked);
    assert!(
        unwound.load(Ordering::SeqCst),
        "what the setup registered was unwound"
    );
    assert_nothing_published(&rt, &store, &created).await;
}

#[actix_rt::test]
async fn an_unknown_tool_in_a_restriction_rolls_the_creation_back() {
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &ScriptedModel::new());
    let (created, _sub) = count_created(&rt);
    let error = rt
        .agents()
        .create(
            CreateAgent::new().setup(|scope: &mut AgentScope, _: &SessionLog| {
                scope.restrict(ToolFilter::deny(["bash"]))?;
                Ok(None)
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::UnknownTool);
    assert_nothing_published(&rt, &store, &created).await;
}

#[actix_rt::test]
async fn a_creation_token_fired_during_setup_publishes_nothing() {
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &ScriptedModel::new());
    let (created, _sub) = count_created(&rt);
    let token = CancellationToken::new();
    let fire = token.clone();
    let committed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&committed);
    let error = rt
        .agents()
        .create(CreateAgent::new().cancel(token).setup(
            move |_: &mut AgentScope, _: &SessionLog| {
                fire.cancel();
                Ok(Some(Box::new(move || flag.store(true, Ordering::SeqCst))
                    as subagents::host::SetupCommit))
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Cancelled);
    assert!(!committed.load(Ordering::SeqCst), "the commit never ran");
    assert_nothing_published(&rt, &store, &created).await;
}

#[actix_rt::test]
async fn a_store_failure_releases_the_reserved_id() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    faults.arm(StoreOperation::Create);
    let store: Arc<dyn SessionPersistence> = faults.clone();
    let rt = runtime_on(Arc::clone(&store), &ScriptedModel::new());
    let (created, _sub) = count_created(&rt);
    let id = subagents::SessionId::new();
    let error = rt
        .agents()
        .create(CreateAgent::new().id(id))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreIo);
    assert_nothing_published(&rt, &store, &created).await;
    faults.disarm(StoreOperation::Create);
    let handle = rt
        .agents()
        .create(CreateAgent::new().id(id))
        .await
        .expect("the id is free again");
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_setup_commit_runs_once_and_setup_events_are_stored() {
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &ScriptedModel::new());
    let committed = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&committed);
    let handle = rt
        .agents()
        .create(
            CreateAgent::new().setup(move |_: &mut AgentScope, log: &SessionLog| {
                log.append(EventKind::Extension {
                    event_type: "sandbox/mode".into(),
                    data: json!({"mode": "read-only"}),
                })?;
                Ok(Some(Box::new(move || flag.store(true, Ordering::SeqCst))
                    as subagents::host::SetupCommit))
            }),
        )
        .await
        .unwrap();
    assert!(committed.load(Ordering::SeqCst));
    let stored = store.inspect(handle.agent().id()).await.unwrap();
    assert_eq!(stored.events.len(), 1);
    assert_eq!(stored.events[0].kind.type_name(), "sandbox/mode");
    handle.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_duplicate_live_id_is_refused_and_the_live_agent_is_untouched() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(store, &model);
    let first = rt.agents().create(CreateAgent::new()).await.unwrap();
    let id = first.agent().id();
    let error = rt
        .agents()
        .create(CreateAgent::new().id(id))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DuplicateAgent);
    assert!(rt.agents().is_live(first.agent()).await);
    run_prompt(first.agent(), "still works").await;
    first.dispose().await.unwrap();
}

#[actix_rt::test]
async fn resume_reproduces_the_log_and_continues_turn_numbering() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let store: Arc<dyn SessionPersistence> = Arc::new(subagents::SledStore::temporary().unwrap());
    let rt = runtime_on(store, &model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let id = handle.agent().id();
    run_prompt(handle.agent(), "one").await;
    let before = handle.agent().log().events();
    handle.dispose().await.unwrap();

    let resumed = rt.agents().resume(ResumeAgent::new(id)).await.unwrap();
    assert_eq!(
        resumed.agent().log().events(),
        before,
        "resume loads the exact stored log"
    );
    run_prompt(resumed.agent(), "two").await;
    let events = resumed.agent().log().events();
    assert_eq!(user_texts(&events), ["one", "two"]);
    assert!(events
        .iter()
        .any(|e| matches!(e.kind, EventKind::TurnStart { turn: 2 })));
    let second_request = &model.requests()[1];
    assert_eq!(
        second_request.messages.len(),
        3,
        "the resumed history reaches the model"
    );
    resumed.dispose().await.unwrap();
}

/// Two resumes of one session race: one wins, the other is refused `DUPLICATE_AGENT`, and the
/// loser never takes the session's lease (which would fence the winner's writer).
#[actix_rt::test]
async fn a_losing_concurrent_resume_never_fences_the_winner() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    for store in [
        Arc::new(MemoryStore::new()) as Arc<dyn SessionPersistence>,
        Arc::new(subagents::SledStore::temporary().unwrap()),
    ] {
        let rt = runtime_on(Arc::clone(&store), &model);
        let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
        let id = handle.agent().id();
        run_prompt(handle.agent(), "one").await;
        handle.dispose().await.unwrap();

        let (first, second) = futures::join!(
            rt.agents().resume(ResumeAgent::new(id)),
            rt.agents().resume(ResumeAgent::new(id))
        );
        let (winner, loser) = match (first, second) {
            (Ok(winner), Err(loser)) | (Err(loser), Ok(winner)) => (winner, loser),
            (first, second) => panic!(
                "exactly one resume wins: {:?} / {:?}",
                first.map(|h| h.agent().id()),
                second.map(|h| h.agent().id())
            ),
        };
        assert_eq!(loser.code(), ErrorCode::DuplicateAgent);
        run_prompt(winner.agent(), "two").await;
        winner
            .agent()
            .log()
            .flush()
            .await
            .expect("the winner still holds the current lease: its writes land");
        winner.dispose().await.unwrap();
        let stored = store.read_from(id, 0).await.unwrap();
        assert_eq!(
            user_texts(&stored),
            ["one", "two"],
            "the winner's turn is stored"
        );
    }
}

#[actix_rt::test]
async fn a_stale_ref_of_a_replaced_agent_is_told_apart_from_the_live_one() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(store, &model);
    let old = rt.agents().create(CreateAgent::new()).await.unwrap();
    let stale = old.agent().clone();
    old.dispose().await.unwrap();
    let new = rt
        .agents()
        .resume(ResumeAgent::new(stale.id()))
        .await
        .unwrap();
    assert_eq!(new.agent().id(), stale.id(), "same session");
    assert_ne!(new.agent(), &stale, "a different incarnation");
    assert!(!rt.agents().is_live(&stale).await);
    assert!(rt.agents().is_live(new.agent()).await);
    let error = stale
        .followup(text("to the dead"), MessageSource::User)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentDisposed);
    assert!(!stale.is_alive());
    new.dispose().await.unwrap();
}

#[actix_rt::test]
async fn resume_requires_persistence_and_refuses_a_live_agent() {
    let model = ScriptedModel::new();
    let bare = Runtime::builder()
        .model("scripted", model.clone())
        .build()
        .unwrap();
    let error = bare
        .agents()
        .resume(ResumeAgent::new(subagents::SessionId::new()))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::PersistenceUnavailable);

    let rt = runtime_on(Arc::new(MemoryStore::new()), &model);
    let live = rt.agents().create(CreateAgent::new()).await.unwrap();
    let error = rt
        .agents()
        .resume(ResumeAgent::new(live.agent().id()))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::DuplicateAgent);
    let error = rt
        .agents()
        .resume(ResumeAgent::new(subagents::SessionId::new()))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::SessionNotFound);
    live.dispose().await.unwrap();
}

#[actix_rt::test]
async fn resume_on_another_runtime_is_refused_while_the_session_is_live_there() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let first = runtime_on(Arc::clone(&store), &model);
    let handle = first.agents().create(CreateAgent::new()).await.unwrap();
    let id = handle.agent().id();
    handle
        .agent()
        .inject(text("pending context"), MessageSource::User)
        .await
        .unwrap();
    handle.agent().log().flush().await.unwrap();

    // A second node over the same store while the first still drives the session.
    let second = runtime_on(Arc::clone(&store), &model);
    let refused = second
        .agents()
        .resume(ResumeAgent::new(id))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::SessionLeased);
    assert!(second.agents().get(id).await.is_none(), "nothing published");
    run_prompt(handle.agent(), "still mine").await;
    handle
        .agent()
        .log()
        .flush()
        .await
        .expect("the first writer is not fenced");
    handle.dispose().await.unwrap();

    // Released: the second node takes over, and the pending work revives there.
    let resumed = second.agents().resume(ResumeAgent::new(id)).await.unwrap();
    run_prompt(resumed.agent(), "go").await;
    assert_eq!(
        user_texts(&resumed.agent().log().events()),
        ["still mine", "pending context", "go"]
    );
    resumed.dispose().await.unwrap();
}

#[actix_rt::test]
async fn dispose_is_idempotent_and_releases_the_agent() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let disposed = Arc::new(Mutex::new(0));
    let sink = Arc::clone(&disposed);
    let _sub = rt
        .events()
        .subscribe(EventScope::Key(agent.id()), move |e: &AgentEvent| {
            if e.kind == AgentEventKind::Disposed {
                *sink.lock().unwrap() += 1;
            }
        });
    agent
        .followup(text("hang"), MessageSource::User)
        .await
        .unwrap();
    let clone = handle.clone();
    let (a, b) = futures::join!(handle.dispose(), clone.dispose());
    a.unwrap();
    b.unwrap();
    handle.dispose().await.unwrap();
    assert_eq!(*disposed.lock().unwrap(), 1, "agent/disposed fires once");
    assert!(rt.agents().get(agent.id()).await.is_none());
    let stored = store.inspect(agent.id()).await.unwrap();
    assert_eq!(
        turn_ends(&stored.events),
        [TurnEndReason::Aborted {
            reason: subagents::CancelCause::Disposed
        }],
        "the final drain handed the cancelled turn to the store"
    );
}

#[actix_rt::test]
async fn scope_disposers_run_in_reverse_order_at_disposal() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let (first, second) = (Arc::clone(&order), Arc::clone(&order));
    let rt = runtime_on(Arc::new(MemoryStore::new()), &ScriptedModel::new());
    let handle = rt
        .agents()
        .create(
            CreateAgent::new().setup(move |scope: &mut AgentScope, _: &SessionLog| {
                scope.on_dispose(Box::new(move || first.lock().unwrap().push(1)));
                scope.on_dispose(Box::new(move || second.lock().unwrap().push(2)));
                Ok(None)
            }),
        )
        .await
        .unwrap();
    assert!(order.lock().unwrap().is_empty());
    handle.dispose().await.unwrap();
    assert_eq!(*order.lock().unwrap(), [2, 1]);
}

#[actix_rt::test]
async fn a_seeded_agent_gets_an_end_seed_marker_and_ignores_inherited_splices() {
    let model = ScriptedModel::with_script([ScriptStep::text("parent"), ScriptStep::text("child")]);
    let rt = runtime_on(Arc::new(MemoryStore::new()), &model);
    let parent = rt.agents().create(CreateAgent::new()).await.unwrap();
    run_prompt(parent.agent(), "p").await;
    let prefix = parent.agent().log().events();
    let inherited = u64::try_from(prefix.len()).unwrap();

    let child = rt
        .agents()
        .create(
            CreateAgent::new()
                .delegated_by(parent.agent().id(), 1)
                .seed(prefix.clone(), inherited),
        )
        .await
        .unwrap();
    let header = child.agent().header();
    assert_eq!(header.seed_length, Some(inherited));
    assert_eq!(header.parent_session, Some(parent.agent().id()));
    let events = child.agent().log().events();
    assert_eq!(events.len(), prefix.len() + 1);
    assert_eq!(events.last().unwrap().kind, EventKind::EndSeed {});
    assert_eq!(
        child.agent().status().await.unwrap().next_turn,
        0,
        "the parent's splices are not replayed"
    );
    run_prompt(child.agent(), "c").await;
    assert!(
        child
            .agent()
            .log()
            .events()
            .iter()
            .any(|e| matches!(e.kind, EventKind::TurnStart { turn: 2 })),
        "turn numbers continue across the seed"
    );
    child.dispose().await.unwrap();
    parent.dispose().await.unwrap();
}

#[actix_rt::test]
async fn an_unbalanced_seed_is_refused_before_anything_is_created() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = runtime_on(Arc::clone(&store), &model);
    let parent = rt.agents().create(CreateAgent::new()).await.unwrap();
    parent
        .agent()
        .followup(text("p"), MessageSource::User)
        .await
        .unwrap();
    let open_turn = parent.agent().log().events();
    let error = rt
        .agents()
        .create(CreateAgent::new().seed(open_turn, 3))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidSeed);
    assert_eq!(
        store.list().await.unwrap().len(),
        1,
        "only the parent is stored"
    );
    parent.dispose().await.unwrap();
}

#[actix_rt::test]
async fn a_send_racing_disposal_never_starts_another_turn() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    model.set_fallback(ScriptStep::text("must not run"));
    let rt = runtime_on(Arc::new(MemoryStore::new()), &model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    agent
        .followup(text("hang"), MessageSource::User)
        .await
        .unwrap();
    // `join!` polls the disposal first: its first poll queues `Retire` in the agent's mailbox,
    // so the send that follows is refused, never run.
    let (disposed, raced) = futures::join!(
        handle.dispose(),
        agent.followup(text("late"), MessageSource::User)
    );
    disposed.unwrap();
    assert_eq!(
        raced
            .expect_err("a send queued behind the disposal is refused")
            .code(),
        ErrorCode::AgentDisposed,
        "a refused send says why"
    );
    assert!(!user_texts(&agent.log().events()).contains(&"late".to_owned()));
    assert_eq!(
        model.request_count(),
        1,
        "no turn ran after the disposal began"
    );
    assert_eq!(turn_ends(&agent.log().events()).len(), 1);
    let error = agent
        .followup(text("after"), MessageSource::User)
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentDisposed);
}

#[actix_rt::test]
async fn shutdown_releases_every_agent_and_refuses_new_ones() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let rt = runtime_on(Arc::new(MemoryStore::new()), &model);
    let busy = rt.agents().create(CreateAgent::new()).await.unwrap();
    busy.agent()
        .followup(text("hang"), MessageSource::User)
        .await
        .unwrap();
    let idle = rt.agents().create(CreateAgent::new()).await.unwrap();
    crate::support::within("the shutdown", rt.shutdown())
        .await
        .unwrap();
    assert!(rt.agents().list().await.is_empty());
    assert!(!busy.agent().is_alive() && !idle.agent().is_alive());
    // A minted id is registered only at publication: the refusal then unwinds the staged
    // agent, and nothing is live.
    let error = rt.agents().create(CreateAgent::new()).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::Draining);
    assert!(rt.agents().list().await.is_empty());
    // A caller's id is reserved first, and refused before anything is stored.
    let id = subagents::SessionId::new();
    let error = rt
        .agents()
        .create(CreateAgent::new().id(id))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Draining);
    assert!(rt.store().unwrap().read_from(id, 0).await.is_err());
}

#[actix_rt::test]
async fn a_creation_dropped_mid_way_unwinds_its_setup_and_frees_the_id() {
    let rt = runtime_on(Arc::new(MemoryStore::new()), &ScriptedModel::new());
    let unwound = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&unwound);
    let id = subagents::SessionId::new();
    {
        let creating = rt.agents().create(CreateAgent::new().id(id).setup(
            move |scope: &mut AgentScope, _: &SessionLog| {
                scope.on_dispose(Box::new(move || flag.store(true, Ordering::SeqCst)));
                Ok(None)
            },
        ));
        let mut creating = Box::pin(creating);
        // The first poll runs the setup and stops at the registry; then the caller gives up.
        assert!(futures::poll!(creating.as_mut()).is_pending());
    }
    assert!(
        unwound.load(Ordering::SeqCst),
        "the dropped creation unwound its setup"
    );
    let handle = rt
        .agents()
        .create(CreateAgent::new().id(id))
        .await
        .expect("the id is free");
    handle.dispose().await.unwrap();
}
