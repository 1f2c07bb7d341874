//! Durability of a live agent: a failed durable write faults the agent (its turn ends with an
//! error, new sends are refused, `flush` and `dispose` report the write's error), and a session
//! is written only under its lease.

use std::sync::Arc;
use std::time::Duration;

use subagents::store::SharedStore;
use subagents::testing::{FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentEventKind, AgentOptions, CreateAgent, ErrorCode, FlushPolicy, MemoryStore, MessageSource,
    ResumeAgent, Runtime, SessionPersistence, TurnEndReason,
};

use crate::support::{run_prompt, text, turn_ends, user_texts, within, EventRecorder};

fn runtime_on(store: SharedStore, model: &ScriptedModel) -> Runtime {
    Runtime::builder()
        .shared_store(store)
        .model("scripted", model.clone())
        .build()
        .unwrap()
}

fn faulting() -> (Arc<MemoryStore>, Arc<FaultInjectingStore>) {
    let inner = Arc::new(MemoryStore::new());
    let faults = Arc::new(FaultInjectingStore::new(
        Arc::clone(&inner) as Arc<dyn SessionPersistence>
    ));
    (inner, faults)
}

fn error_code(reason: &TurnEndReason) -> Option<&str> {
    match reason {
        TurnEndReason::Error { error } => Some(error.code.as_str()),
        _ => None,
    }
}

#[actix_rt::test]
async fn a_failed_append_mid_turn_faults_the_agent_and_every_later_call_reports_it() {
    let gate = Gate::new();
    let model = ScriptedModel::with_script([
        ScriptStep::text("first"),
        ScriptStep::text("never streamed").gated(&gate),
    ]);
    let (inner, faults) = faulting();
    let rt = runtime_on(Arc::clone(&faults) as SharedStore, &model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    let agent = handle.agent().clone();
    let recorder = EventRecorder::new(&rt, agent.id());
    run_prompt(&agent, "first").await;
    agent
        .log()
        .flush()
        .await
        .expect("the first turn is durable");

    faults.arm(StoreOperation::Append);
    agent
        .followup(text("work"), MessageSource::User)
        .await
        .expect("accepted before the write-behind ran");
    // The fault cancels the turn held at the gate; the gate is never released.
    within("the faulted turn to end", agent.when_idle()).await;

    let events = agent.log().events();
    let ends = turn_ends(&events);
    assert_eq!(
        ends.last().and_then(error_code),
        Some("STORE_IO"),
        "the running turn ends with the write's error: {ends:?}"
    );
    assert!(recorder.kinds().iter().any(|kind| matches!(
        kind,
        AgentEventKind::Faulted { error } if error.code() == ErrorCode::StoreIo
    )));
    assert!(agent.status().await.unwrap().faulted);
    let refused = agent
        .followup(text("more"), MessageSource::User)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::AgentFaulted);
    assert_eq!(
        agent.log().flush().await.unwrap_err().code(),
        ErrorCode::StoreIo
    );

    faults.disarm(StoreOperation::Append);
    assert_eq!(
        handle.dispose().await.unwrap_err().code(),
        ErrorCode::StoreIo,
        "dispose reports the lost write"
    );
    assert!(
        rt.agents().get(agent.id()).await.is_none(),
        "released all the same"
    );
    let stored = inner.read_from(agent.id(), 0).await.unwrap();
    assert!(!stored.is_empty());
    assert!(
        stored
            .iter()
            .map(|event| &**event)
            .eq(&events[..stored.len()]),
        "the store holds a prefix of the log"
    );
    assert!(
        stored.len() < events.len(),
        "nothing after the fault was written"
    );
}

#[actix_rt::test]
async fn a_failed_step_flush_ends_the_turn_with_an_error_under_flush_every_step() {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let (_, faults) = faulting();
    let rt = runtime_on(Arc::clone(&faults) as SharedStore, &model);
    let options = AgentOptions {
        flush: FlushPolicy::EveryStep,
        ..AgentOptions::default()
    };
    let handle = rt
        .agents()
        .create(CreateAgent::new().options(options))
        .await
        .unwrap();
    faults.arm(StoreOperation::Flush);
    let events = run_prompt(handle.agent(), "work").await;
    assert_eq!(
        turn_ends(&events).last().and_then(error_code),
        Some("STORE_IO"),
        "a step whose flush failed is not reported as completed"
    );
    let refused = handle
        .agent()
        .followup(text("more"), MessageSource::User)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::AgentFaulted);
    faults.disarm(StoreOperation::Flush);
    assert_eq!(
        handle.dispose().await.unwrap_err().code(),
        ErrorCode::StoreIo
    );
}

#[actix_rt::test]
async fn a_failed_create_or_lease_publishes_nothing() {
    let model = ScriptedModel::new();
    for operation in [StoreOperation::Create, StoreOperation::AcquireLease] {
        let (_, faults) = faulting();
        let rt = runtime_on(Arc::clone(&faults) as SharedStore, &model);
        let created = Arc::new(std::sync::Mutex::new(0));
        let sink = Arc::clone(&created);
        let _sub = rt.events().subscribe(
            subagents::EventScope::All,
            move |event: &subagents::AgentEvent| {
                if event.kind == AgentEventKind::Created {
                    *sink.lock().unwrap() += 1;
                }
            },
        );
        faults.arm(operation);
        let error = rt.agents().create(CreateAgent::new()).await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::StoreIo, "{operation:?}");
        assert!(rt.agents().list().await.is_empty(), "{operation:?}");
        assert_eq!(
            *created.lock().unwrap(),
            0,
            "{operation:?}: no agent/created"
        );
        faults.disarm(operation);
        let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
        handle.dispose().await.unwrap();
    }
}

#[actix_rt::test]
async fn a_failed_lease_release_is_reported_by_dispose() {
    let model = ScriptedModel::new();
    let (_, faults) = faulting();
    let rt = runtime_on(Arc::clone(&faults) as SharedStore, &model);
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    faults.arm(StoreOperation::ReleaseLease);
    assert_eq!(
        handle.dispose().await.unwrap_err().code(),
        ErrorCode::StoreIo
    );
    assert!(rt.agents().list().await.is_empty());
}

#[actix_rt::test]
async fn a_writer_whose_lease_expired_and_was_taken_over_is_fenced_and_faults() {
    tokio::time::pause();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let inner: Arc<dyn SessionPersistence> =
        Arc::new(MemoryStore::with_lease_ttl(Duration::from_secs(30)));
    let faults = Arc::new(FaultInjectingStore::new(Arc::clone(&inner)));
    let first = runtime_on(Arc::clone(&faults) as SharedStore, &model);
    let handle = first.agents().create(CreateAgent::new()).await.unwrap();
    let id = handle.agent().id();
    run_prompt(handle.agent(), "one").await;
    handle.agent().log().flush().await.unwrap();

    // The first runtime can no longer renew (a partition): its lease runs out.
    faults.arm(StoreOperation::RenewLease);
    tokio::time::advance(Duration::from_secs(31)).await;
    let second = runtime_on(Arc::clone(&inner), &model);
    let resumed = second.agents().resume(ResumeAgent::new(id)).await.unwrap();

    handle
        .agent()
        .followup(text("stale"), MessageSource::User)
        .await
        .expect("accepted in memory before the writer is fenced");
    assert_eq!(
        handle.agent().log().flush().await.unwrap_err().code(),
        ErrorCode::LeaseLost,
        "the stale writer's append is refused"
    );
    assert_eq!(
        handle
            .agent()
            .followup(text("more"), MessageSource::User)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::AgentFaulted
    );

    run_prompt(resumed.agent(), "two").await;
    resumed.agent().log().flush().await.unwrap();
    assert_eq!(
        user_texts(&inner.read_from(id, 0).await.unwrap()),
        ["one", "two"],
        "the new writer's log has nothing of the fenced one"
    );
    resumed.dispose().await.unwrap();
    assert_eq!(
        handle.dispose().await.unwrap_err().code(),
        ErrorCode::LeaseLost
    );
}

#[actix_rt::test]
async fn a_lease_with_a_ttl_is_renewed_while_the_agent_lives() {
    tokio::time::pause();
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    let inner: Arc<dyn SessionPersistence> =
        Arc::new(MemoryStore::with_lease_ttl(Duration::from_secs(30)));
    let first = runtime_on(Arc::clone(&inner), &model);
    let handle = first.agents().create(CreateAgent::new()).await.unwrap();
    let id = handle.agent().id();
    for _ in 0..4 {
        tokio::time::advance(Duration::from_secs(11)).await;
        // Let the writer's renewal run at the time it was due.
        tokio::task::yield_now().await;
    }
    let second = runtime_on(Arc::clone(&inner), &model);
    assert_eq!(
        second
            .agents()
            .resume(ResumeAgent::new(id))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::SessionLeased,
        "44 s after creation, a 30 s lease is still held because it was renewed"
    );
    run_prompt(handle.agent(), "still here").await;
    handle.agent().log().flush().await.unwrap();
    handle.dispose().await.unwrap();
}
