//! Ownership: every child is owned by its exact parent from the moment its id is reserved; a
//! retiring parent takes no child; disposal and shutdown release children first; creations and
//! runs are drop-safe.

use std::sync::{Arc, Mutex};
use std::task::Poll;

use subagents::store::LeaseHolder;
use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    AgentEvent, AgentEventKind, CreateAgent, ErrorCode, EventScope, MemoryStore, MessageSource,
    Runtime, SessionId, SessionPersistence, StopReason, SubagentStartRequest, Subscription,
};
use tokio_util::sync::CancellationToken;

use crate::support::{root, seam_runtime_on, start_run, text, within, SeamRecorder};

/// A seam runtime over a store that can hold or fail operations.
async fn held_runtime(model: &ScriptedModel) -> (Runtime, Arc<FaultInjectingStore>) {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        faults.clone(),
    )
    .await;
    (rt, faults)
}

type Lifecycle = Arc<Mutex<Vec<(&'static str, SessionId)>>>;

/// Records `agent/created` and `agent/disposed` of every agent, in order.
fn lifecycle(rt: &Runtime) -> (Lifecycle, Subscription) {
    let (seen, subscription, _) = watched_lifecycle(rt);
    (seen, subscription)
}

/// [`lifecycle`], plus a channel that ticks on every recorded event.
fn watched_lifecycle(
    rt: &Runtime,
) -> (Lifecycle, Subscription, tokio::sync::watch::Receiver<usize>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let (tick, ticks) = tokio::sync::watch::channel(0);
    let subscription = rt
        .events()
        .subscribe(EventScope::All, move |event: &AgentEvent| {
            let name = match event.kind {
                AgentEventKind::Created => "created",
                AgentEventKind::Disposed => "disposed",
                _ => return,
            };
            sink.lock().unwrap().push((name, event.agent));
            tick.send_modify(|count| *count += 1);
        });
    (seen, subscription, ticks)
}

fn disposed_order(seen: &Mutex<Vec<(&'static str, SessionId)>>) -> Vec<SessionId> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name == "disposed")
        .map(|(_, id)| *id)
        .collect()
}

// SPAWN-26
#[actix_rt::test]
async fn a_disposing_parent_refuses_new_children_with_no_orphan() {
    let model = ScriptedModel::new();
    let (rt, faults) = held_runtime(&model).await;
    let parent = root(&rt).await;
    let agent = parent.agent().clone();
    // Hold the parent's disposal at its final discard's write, so it stays "disposing".
    agent
        .inject(text("pending"), MessageSource::User)
        .await
        .unwrap();
    agent.log().flush().await.unwrap();
    faults.hold(StoreOperation::Append);
    let disposal = tokio::spawn({
        let parent = parent.clone();
        async move { parent.dispose().await }
    });
    within(
        "the disposal to reach its final write",
        faults.held_calls(1),
    )
    .await;
    let (seen, _sub) = lifecycle(&rt);
    let recorder = SeamRecorder::new(&rt, EventScope::All);

    let error = rt
        .subagents()
        .start("spawn", SubagentStartRequest::new(&agent, text("x")))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::AgentDisposed);
    assert!(error.message().contains("inactive context"), "{error}");

    faults.release(StoreOperation::Append);
    within("the disposal", disposal).await.unwrap().unwrap();
    assert!(rt.agents().list().await.is_empty(), "no orphaned child");
    assert!(
        seen.lock()
            .unwrap()
            .iter()
            .all(|(name, _)| *name != "created"),
        "no agent/created"
    );
    assert!(recorder.events().is_empty(), "no subagent/start");
}

/// How many scheduler turns apart a start and the event racing it are issued: each count is
/// one deterministic interleaving of the two on the test's single thread.
const INTERLEAVINGS: usize = 16;

// A one-shot child's creation stores nothing before it is published (its session is stored
// from its first step), so the window of its setup transaction is its publication: a parent
// disposal issued any number of turns after the start lands either before it (refused, with
// no publication notification) or after it (the published child is released first).
// SPAWN-27
#[actix_rt::test]
async fn parent_disposal_during_the_child_setup_transaction_publishes_nothing() {
    let mut refused = 0;
    for turns in 0..INTERLEAVINGS {
        let model = ScriptedModel::repeating(ScriptStep::text("never"));
        let (rt, faults) = held_runtime(&model).await;
        let parent = root(&rt).await;
        let agent = parent.agent().clone();
        let (seen, _sub) = lifecycle(&rt);
        let recorder = SeamRecorder::new(&rt, EventScope::All);
        let start = tokio::spawn(
            rt.subagents()
                .start("spawn", SubagentStartRequest::new(&agent, text("x"))),
        );
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
        within("the parent disposal", parent.dispose())
            .await
            .unwrap();
        match within("the start", start).await.unwrap() {
            Err(error) => {
                refused += 1;
                assert_eq!(error.code(), ErrorCode::AgentDisposed, "{error}");
                assert!(
                    seen.lock()
                        .unwrap()
                        .iter()
                        .all(|(name, _)| *name != "created"),
                    "no publication notification ({turns} turns)"
                );
                assert!(recorder.events().is_empty(), "no subagent/start");
                assert!(
                    faults.list_children(agent.id()).await.unwrap().is_empty(),
                    "no child session was stored ({turns} turns)"
                );
            }
            Ok(run) => {
                assert_eq!(
                    disposed_order(&seen),
                    [run.id(), agent.id()],
                    "a child published first is released before its parent ({turns} turns)"
                );
                run.dispose().await.unwrap();
            }
        }
        assert!(rt.agents().list().await.is_empty(), "no orphaned child");
    }
    assert!(
        refused > 0,
        "some interleaving disposes the parent inside the child's creation"
    );
}

// A cancel racing the creation: whatever turn it lands on, the start is refused with nothing
// published (no agent, no notification, no stored session), or the run is published and
// settles.
#[actix_rt::test]
async fn a_cancel_during_the_child_creation_rejects_the_start_with_nothing_published() {
    let mut refused = 0;
    for turns in 0..INTERLEAVINGS {
        let model = ScriptedModel::repeating(ScriptStep::text("never"));
        let (rt, faults) = held_runtime(&model).await;
        let parent = root(&rt).await;
        let agent = parent.agent().clone();
        let (seen, _sub) = lifecycle(&rt);
        let token = CancellationToken::new();
        let start = tokio::spawn(rt.subagents().start(
            "spawn",
            SubagentStartRequest::new(&agent, text("x")).cancel(token.clone()),
        ));
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
        token.cancel();
        match within("the start", start).await.unwrap() {
            Err(error) => {
                refused += 1;
                assert_eq!(error.code(), ErrorCode::AbortedBeforePublication);
                assert_eq!(rt.agents().list().await.len(), 1, "only the parent is live");
                assert!(
                    seen.lock()
                        .unwrap()
                        .iter()
                        .all(|(name, _)| *name != "created"),
                    "nothing published ({turns} turns)"
                );
                assert!(
                    faults.list_children(agent.id()).await.unwrap().is_empty(),
                    "no child session ({turns} turns)"
                );
            }
            Ok(run) => {
                let result = within("the run", run.result()).await.unwrap();
                assert!(
                    matches!(
                        result.stop_reason,
                        StopReason::Aborted | StopReason::Completed
                    ),
                    "{result:?}"
                );
                run.dispose().await.unwrap();
            }
        }
        parent.dispose().await.unwrap();
    }
    assert!(refused > 0, "a cancel that lands first refuses the start");
}

#[actix_rt::test]
async fn disposing_a_parent_cancels_and_releases_its_live_children_first() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let (rt, _) = held_runtime(&model).await;
    let parent = root(&rt).await;
    let run = start_run(&rt, "spawn", parent.agent(), "hang").await;
    let child = run.local_agent().expect("an in-process child").id();
    let (seen, _sub) = lifecycle(&rt);
    within("the parent disposal", parent.dispose())
        .await
        .unwrap();
    assert_eq!(
        disposed_order(&seen),
        [child, parent.agent().id()],
        "the child is released before its parent"
    );
    let result = within("the run's result", run.result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    run.dispose().await.expect("disposing again is a no-op");
}

#[actix_rt::test]
async fn shutdown_releases_the_forest_child_first() {
    let model = ScriptedModel::new();
    let (rt, _) = held_runtime(&model).await;
    let top = root(&rt).await;
    let middle = rt
        .agents()
        .create(CreateAgent::new().owned_by(top.agent(), 1))
        .await
        .unwrap();
    let bottom = rt
        .agents()
        .create(CreateAgent::new().owned_by(middle.agent(), 2))
        .await
        .unwrap();
    let other = root(&rt).await;
    let (seen, _sub) = lifecycle(&rt);
    within("shutdown", rt.shutdown()).await.unwrap();
    let order = disposed_order(&seen);
    let at = |id: SessionId| order.iter().position(|x| *x == id).expect("disposed");
    assert!(at(bottom.agent().id()) < at(middle.agent().id()));
    assert!(at(middle.agent().id()) < at(top.agent().id()));
    assert_eq!(order.len(), 4, "every agent, {other:?} included, once");
    assert!(rt.agents().list().await.is_empty());
}

#[actix_rt::test]
async fn a_create_dropped_at_any_await_leaves_nothing_live_or_leased() {
    let model = ScriptedModel::new();
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let rt = seam_runtime_on(
        Runtime::builder().model("scripted", model.clone()),
        Arc::clone(&store),
    )
    .await;
    let mut ids = Vec::new();
    for polls in 0.. {
        let id = SessionId::new();
        ids.push(id);
        let mut creation = Box::pin(rt.agents().create(CreateAgent::new().id(id)));
        let mut finished = None;
        for _ in 0..polls {
            if let Poll::Ready(outcome) = futures::poll!(creation.as_mut()) {
                finished = Some(outcome);
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(creation);
        if let Some(outcome) = finished {
            outcome.unwrap().dispose().await.unwrap();
            break;
        }
        assert!(polls < 100, "the creation completes within 100 polls");
    }
    // Dropped creations freed their reservations (shutdown would wait for them forever) and
    // disposed whatever they had published.
    within("shutdown after dropped creations", rt.shutdown())
        .await
        .unwrap();
    assert!(rt.agents().list().await.is_empty());
    for id in ids {
        if store.header(id).await.is_ok() {
            store
                .acquire_lease(id, LeaseHolder::new())
                .await
                .expect("no dropped creation keeps its lease");
        }
    }
}

#[actix_rt::test]
async fn a_run_dropped_undisposed_disposes_its_child_in_the_background() {
    let model = ScriptedModel::with_script([ScriptStep::Hang]);
    let (rt, _) = held_runtime(&model).await;
    let parent = root(&rt).await;
    let (seen, _sub, mut ticks) = watched_lifecycle(&rt);
    let run = start_run(&rt, "spawn", parent.agent(), "hang").await;
    let child = run.local_agent().expect("an in-process child").id();
    drop(run);
    within(
        "the dropped run's child to be released",
        ticks.wait_for(|_| disposed_order(&seen).contains(&child)),
    )
    .await
    .unwrap();
    assert_eq!(rt.agents().list().await.len(), 1, "only the parent is live");
    parent.dispose().await.unwrap();
}
