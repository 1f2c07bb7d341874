//! The cost of a cold resume (issue #16): a follow-up to an absent child reads the child's
//! stored log once — the inspection that checks the sender's authority and the child's
//! descriptor is the log the resumed agent loads — and still closes an interrupted last turn
//! durably under the new lease.

use std::sync::Arc;

use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel};
use subagents::{
    AgentHandle, EventKind, EventScope, MemoryStore, ResumeAgent, Runtime, SessionId,
    SessionPersistence, TurnEndReason,
};

use crate::support::{
    followup_child, released, root, seam_runtime_on, settled, start_continuable, turn_ends,
    SeamRecorder,
};

/// A root parent on `rt` with one continuable child that settled its first epoch and was
/// released (absent: its next follow-up is a cold resume), and a recorder of the parent's
/// children's lifecycle.
async fn released_child(rt: &Runtime) -> (AgentHandle, SessionId, SeamRecorder) {
    let parent = root(rt).await;
    let recorder = SeamRecorder::new(rt, EventScope::Key(parent.agent().id()));
    let child = start_continuable(rt, parent.agent(), "child task")
        .await
        .child_id;
    settled(&recorder, child, 1).await;
    released(rt, child).await;
    (parent, child, recorder)
}

/// A runtime over `store` whose every model answer is "ok".
async fn runtime_on(store: Arc<dyn SessionPersistence>) -> Runtime {
    let model = ScriptedModel::repeating(ScriptStep::text("ok"));
    seam_runtime_on(Runtime::builder().model("scripted", model), store).await
}

// A cold resume read the child's log twice before (its inspection, then the resume's load).
#[actix_rt::test]
async fn a_cold_resume_reads_the_childs_log_once() {
    let store = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let rt = runtime_on(Arc::clone(&store) as Arc<dyn SessionPersistence>).await;
    let (parent, child, recorder) = released_child(&rt).await;
    let stored = store.read_from(child, 0).await.unwrap().len();
    assert!(stored > 5, "one epoch is stored: {stored} events");

    let before = store.events_read(child);
    followup_child(&rt, parent.agent(), child, "continue")
        .await
        .expect("the absent child is resumed");
    assert_eq!(
        store.events_read(child) - before,
        stored,
        "the resume loads the log its inspection read"
    );
    settled(&recorder, child, 2).await;
    rt.shutdown().await.unwrap();
}

// The inspection closes an interrupted turn in memory only; the resume that loads it must
// store the closing events before the new turn, as a resume that reads the log itself does.
#[actix_rt::test]
async fn a_cold_resume_closes_an_interrupted_turn_durably() {
    // A settled child, copied with its last turn cut before its end: as a process that died
    // mid-turn left it.
    let first = runtime_on(Arc::new(MemoryStore::new())).await;
    let (parent, child, _) = released_child(&first).await;
    let parent_id = parent.agent().id();
    parent.dispose().await.unwrap();
    let source = first.store().expect("the runtime has a store");
    let copy: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    for id in [parent_id, child] {
        let header = source.header(id).await.unwrap();
        let mut events = source.read_from(id, 0).await.unwrap();
        if id == child {
            let end = events
                .iter()
                .rposition(|event| matches!(event.kind, EventKind::TurnEnd { .. }))
                .unwrap();
            events.truncate(end);
        }
        copy.create(header, events).await.unwrap();
    }
    first.shutdown().await.unwrap();
    let cut = copy.read_from(child, 0).await.unwrap().len();

    let rt = runtime_on(Arc::clone(&copy)).await;
    let parent = rt
        .agents()
        .resume(ResumeAgent::new(parent_id))
        .await
        .expect("the parent resumes");
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent_id));
    followup_child(&rt, parent.agent(), child, "continue")
        .await
        .expect("the interrupted child is resumed");
    settled(&recorder, child, 1).await;
    released(&rt, child).await;
    let events = copy.read_from(child, 0).await.unwrap();
    assert_eq!(
        turn_ends(&events),
        [TurnEndReason::Interrupted, TurnEndReason::Completed],
        "the interrupted turn is closed in the store before the new one"
    );
    assert!(
        matches!(
            events[cut..].last().map(|event| &event.kind),
            Some(EventKind::TurnEnd { .. })
        ),
        "the stored log continues where the cut left it"
    );
    rt.shutdown().await.unwrap();
}

// On PostgreSQL the lease's grant tells the stored log's length (the session's row it locks
// holds it): a cold resume whose inspection is that long reads nothing more, one round trip
// fewer to acceptance. Before, the resume asked for what was appended since its inspection,
// a read that found nothing, every time.
#[actix_rt::test]
async fn a_cold_resume_on_postgres_asks_for_its_log_once() {
    let url = crate::support::postgres::postgres_or_skip!().fresh_database();
    let store = Arc::new(
        subagents::store::PostgresStore::connect(&url)
            .await
            .unwrap(),
    );
    let rt = runtime_on(Arc::clone(&store) as Arc<dyn SessionPersistence>).await;
    let (parent, child, recorder) = released_child(&rt).await;

    let before = store.batched_calls().reads;
    followup_child(&rt, parent.agent(), child, "continue")
        .await
        .expect("the absent child is resumed");
    assert_eq!(
        store.batched_calls().reads - before,
        1,
        "the inspection, and no read after the lease"
    );
    settled(&recorder, child, 2).await;
    let events = store.read_from(child, 0).await.unwrap();
    assert_eq!(turn_ends(&events).len(), 2, "both epochs are stored");
    rt.shutdown().await.unwrap();
}
