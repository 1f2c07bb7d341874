//! Fork seeds stored by reference (issue #16): a fork child's store holds only its own events
//! and a reference to its parent's prefix, on every store; readers resolve it, through forks of
//! forks and after a reopen; a changed prefix is a typed `STORE_CORRUPT`, never a wrong log.

use std::sync::Arc;

use subagents::session::seed::MAX_SEED_LINKS;
use subagents::store::{PostgresStore, SledStore};
use subagents::testing::{FaultInjectingStore, Gate, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    ContinuableStartSpec, ErrorCode, EventKind, EventList, EventScope, MemoryStore, Runtime,
    SeedReference, SessionEvent, SessionHeader, SessionId, SessionPersistence, SubagentListEntry,
};

use crate::support::postgres::postgres_or_skip;
use crate::support::{
    released, root, run_prompt, seam_runtime_on, settled, start_run, text, within, SeamRecorder,
};

/// A runtime over `store` whose every model answer is "answer".
async fn runtime_on(store: Arc<dyn SessionPersistence>) -> (Runtime, ScriptedModel) {
    let model = ScriptedModel::repeating(ScriptStep::text("answer"));
    let rt = seam_runtime_on(Runtime::builder().model("scripted", model.clone()), store).await;
    (rt, model)
}

/// Starts a continuable `fork` child of `parent` and waits for its first epoch to settle.
async fn fork_and_settle(rt: &Runtime, parent: &subagents::AgentRef) -> SessionId {
    let recorder = SeamRecorder::new(rt, EventScope::Key(parent.id()));
    let started = rt
        .subagents()
        .start_continuable(ContinuableStartSpec::new(
            "fork",
            "forked task",
            parent,
            text("forked task"),
        ))
        .await
        .expect("the fork starts");
    settled(&recorder, started.child_id, 1).await;
    started.child_id
}

fn plain(events: &[Arc<SessionEvent>]) -> Vec<SessionEvent> {
    events.iter().map(|event| (**event).clone()).collect()
}

/// Checks what `store` holds of the fork `child` of `parent`: a header whose seed reference
/// names the parent's first `seedLength` events, a stored log that starts after them, and a
/// resolved log whose prefix is the parent's.
async fn assert_stored_by_reference(
    store: &dyn SessionPersistence,
    parent: SessionId,
    child: SessionId,
) -> Vec<SessionEvent> {
    let header = store.header(child).await.unwrap();
    let reference = *header
        .seed_reference
        .expect("a fork's seed is stored by reference");
    assert_eq!(reference.session, parent);
    assert_eq!(Some(reference.length), header.seed_length);
    let stored = store.read_stored(child, 0, u64::MAX).await.unwrap();
    assert_eq!(
        stored.first().map(|event| event.seq),
        Some(reference.length),
        "the child's own log starts after its seed: nothing inherited is stored twice"
    );
    let resolved = plain(&store.read_from(child, 0).await.unwrap());
    let n = usize::try_from(reference.length).unwrap();
    let parents = plain(&store.read_from(parent, 0).await.unwrap());
    assert_eq!(
        resolved[..n],
        parents[..n],
        "the seed is the parent's prefix"
    );
    assert_eq!(resolved[n..], plain(&stored)[..]);
    assert!(matches!(resolved[n].kind, EventKind::EndSeed {}));
    assert!(matches!(resolved[n - 1].kind, EventKind::TurnEnd { .. }));
    assert_eq!(
        plain(&store.read_from(child, reference.length - 1).await.unwrap())[..],
        resolved[n - 1..],
        "a read from inside the seed resolves from there"
    );
    resolved
}

/// A parent with two completed turns forks a continuable child on `store`; the store is
/// inspected for a reference, and the child's live log is what the store resolves.
async fn a_fork_on(store: Arc<dyn SessionPersistence>) {
    let (rt, _) = runtime_on(Arc::clone(&store)).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "first").await;
    run_prompt(parent.agent(), "second").await;
    let child = fork_and_settle(&rt, parent.agent()).await;
    assert_stored_by_reference(&*store, parent.agent().id(), child).await;
    within("shutdown", rt.shutdown()).await.unwrap();
}

#[actix_rt::test]
async fn a_forks_seed_is_a_reference_on_the_memory_store() {
    a_fork_on(Arc::new(MemoryStore::new())).await;
}

#[actix_rt::test]
async fn a_forks_seed_is_a_reference_on_the_sled_store() {
    let dir = tempfile::tempdir().unwrap();
    a_fork_on(Arc::new(SledStore::open(dir.path()).unwrap())).await;
}

#[actix_rt::test]
async fn a_forks_seed_is_a_reference_on_the_postgres_store() {
    let url = postgres_or_skip!().fresh_database();
    a_fork_on(Arc::new(PostgresStore::connect(&url).await.unwrap())).await;
}

// A reopened store (a new connection, a new runtime) resolves the reference, and a follow-up
// cold-resumes the fork with its inherited conversation: its model sees the parent's turns.
// (tests/crash.rs reopens a sled store a killed load run left, with forks in it.)
#[actix_rt::test]
async fn a_reopened_store_resolves_a_fork_and_its_cold_resume_sees_the_parents_turns() {
    let url = postgres_or_skip!().fresh_database();
    let (parent, child, resolved) = {
        let store: Arc<dyn SessionPersistence> =
            Arc::new(PostgresStore::connect(&url).await.unwrap());
        let (rt, _) = runtime_on(Arc::clone(&store)).await;
        let parent = root(&rt).await;
        run_prompt(parent.agent(), "the parent's first question").await;
        let child = fork_and_settle(&rt, parent.agent()).await;
        let resolved = assert_stored_by_reference(&*store, parent.agent().id(), child).await;
        let parent = parent.agent().id();
        within("shutdown", rt.shutdown()).await.unwrap();
        drop(rt);
        (parent, child, resolved)
    };
    let store: Arc<dyn SessionPersistence> = Arc::new(
        PostgresStore::connect(&url)
            .await
            .expect("the store reopens"),
    );
    assert_eq!(
        plain(&store.read_from(child, 0).await.unwrap()),
        resolved,
        "the reopened store resolves the same log"
    );
    let (rt, model) = runtime_on(Arc::clone(&store)).await;
    let parent = rt
        .agents()
        .resume(subagents::ResumeAgent::new(parent))
        .await
        .expect("the parent resumes");
    let recorder = SeamRecorder::new(&rt, EventScope::Key(parent.agent().id()));
    let asked_before = model.requests().len();
    rt.subagents()
        .followup(
            parent.agent(),
            child,
            text("and now?"),
            subagents::FollowupOptions::new(subagents::MessageSource::User),
        )
        .await
        .expect("the follow-up cold-resumes the fork");
    settled(&recorder, child, 1).await;
    let requests = model.requests();
    let asked = requests
        .get(asked_before..)
        .and_then(|new| new.first())
        .expect("the resumed fork asked its model");
    let said: Vec<String> = asked.messages.iter().map(|m| m.text()).collect();
    assert_eq!(
        said.first().map(String::as_str),
        Some("the parent's first question"),
        "the resumed fork's history starts with the inherited turn: {said:?}"
    );
    assert!(
        said.iter().any(|message| message == "and now?"),
        "and the follow-up: {said:?}"
    );
    within("shutdown", rt.shutdown()).await.unwrap();
}

// A fork of a fork references its parent, which references its own: a reader follows both
// links; past `MAX_SEED_LINKS` a fork stores its seed inline, so no read chains further.
#[actix_rt::test]
async fn forks_of_forks_chain_their_references_and_a_long_chain_is_flattened() {
    let store: Arc<dyn SessionPersistence> = Arc::new(MemoryStore::new());
    let (rt, _) = runtime_on(Arc::clone(&store)).await;
    let first = root(&rt).await;
    run_prompt(first.agent(), "the root's question").await;
    let mut parent = first;
    let mut links = Vec::new();
    for _ in 0..=MAX_SEED_LINKS {
        let child = fork_and_settle(&rt, parent.agent()).await;
        let header = store.header(child).await.unwrap();
        links.push(header.seed_reference.map(|reference| reference.links));
        let events = plain(&store.read_from(child, 0).await.unwrap());
        assert_eq!(
            events.iter().find_map(|event| match &event.kind {
                EventKind::UserMessage(message) => Some(message.text()),
                _ => None,
            }),
            Some("the root's question".to_owned()),
            "every fork down the chain resolves back to the root's turn"
        );
        // Released once settled: resumed as an agent of its own, to fork from.
        released(&rt, child).await;
        parent = rt
            .agents()
            .resume(subagents::ResumeAgent::new(child))
            .await
            .expect("the settled fork resumes");
    }
    let mut expected: Vec<Option<u32>> = (1..=MAX_SEED_LINKS).map(Some).collect();
    expected.push(None);
    assert_eq!(links, expected);
    let flattened = parent.agent().id();
    let stored = store.read_stored(flattened, 0, u64::MAX).await.unwrap();
    assert_eq!(
        stored.first().map(|event| event.seq),
        Some(0),
        "the fork past the bound stores its seed inline"
    );
    within("shutdown", rt.shutdown()).await.unwrap();
}

// The reference never names unwritten events: while the parent's appends are held, its fork is
// not stored; once they are written, it is.
#[actix_rt::test]
async fn a_fork_is_stored_only_after_the_prefix_it_references() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let store: Arc<dyn SessionPersistence> = Arc::clone(&faults) as _;
    let (rt, _) = runtime_on(Arc::clone(&store)).await;
    let parent = root(&rt).await;
    faults.hold(StoreOperation::Append);
    run_prompt(parent.agent(), "first").await;
    let parent_id = parent.agent().id();
    assert_eq!(
        store.read_from(parent_id, 0).await.unwrap().len(),
        0,
        "the parent's turn is not written yet"
    );
    let starting = {
        let rt = rt.clone();
        let parent = parent.agent().clone();
        tokio::spawn(async move {
            rt.subagents()
                .start_continuable(ContinuableStartSpec::new(
                    "fork",
                    "forked task",
                    &parent,
                    text("forked task"),
                ))
                .await
        })
    };
    // The listing is the store's own account: no child is stored under the parent while its
    // prefix waits (the start itself waits for the child's creation to be stored).
    for _ in 0..50 {
        tokio::task::yield_now().await;
        assert!(
            store.list_children(parent_id).await.unwrap().is_empty(),
            "a fork stored before its parent's prefix"
        );
    }
    faults.release(StoreOperation::Append);
    let child = within("the start", starting)
        .await
        .unwrap()
        .expect("the fork starts once the prefix is written")
        .child_id;
    assert_stored_by_reference(&*store, parent_id, child).await;
    within("shutdown", rt.shutdown()).await.unwrap();
}

/// Stores a parent with one completed turn and a child whose seed references it by `reference`.
async fn stored_pair(
    store: &dyn SessionPersistence,
    reference: impl FnOnce(&mut SeedReference),
) -> SessionId {
    let log = subagents::SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap();
    log.append(EventKind::TurnStart { turn: 1 }).unwrap();
    log.append(EventKind::TurnEnd {
        turn: 1,
        reason: subagents::TurnEndReason::Completed,
        traceparent: None,
    })
    .unwrap();
    let parent = log.header();
    let events: Vec<Arc<SessionEvent>> = log.with_events(EventList::to_vec);
    store.create(parent.clone(), events.clone()).await.unwrap();
    let seed = subagents::Seed::completed_turns_of(&log);
    let mut header = SessionHeader::new(SessionId::new());
    header.parent_session = Some(parent.id);
    header.seed_length = Some(2);
    let child = subagents::SessionLog::seeded(header, seed).unwrap();
    let mut header = child.header();
    let mut changed = **header.seed_reference.as_ref().unwrap();
    reference(&mut changed);
    header.seed_reference = Some(Box::new(changed));
    let own: Vec<Arc<SessionEvent>> =
        child.with_events(|events| events.iter_from(2).cloned().collect());
    store.create(header.clone(), own).await.unwrap();
    header.id
}

// A listing names a cold one-shot fork from its creation batch: it reads none of the seed,
// however long the parent's transcript (it read and folded the whole seed once, which made
// listing a root's forks quadratic in its children; then the seed's last event). The child's
// own reads still prove the reference by that last event's digest.
#[actix_rt::test]
async fn a_listing_reads_no_event_of_a_one_shot_forks_seed() {
    let store = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let (rt, _) = runtime_on(Arc::clone(&store) as Arc<dyn SessionPersistence>).await;
    let parent = root(&rt).await;
    for turn in 0..10 {
        run_prompt(parent.agent(), &format!("turn {turn}")).await;
    }
    let run = start_run(&rt, "fork", parent.agent(), "fork task").await;
    run.result().await.expect("the fork answers");
    let child = run.id();
    run.dispose().await.unwrap();
    let parent_id = parent.agent().id();
    let seed_length = store.header(child).await.unwrap().seed_len();
    assert!(seed_length > 40, "ten turns are inherited");

    let before = store.events_read(parent_id);
    let listed = within(
        "the listing",
        rt.subagents()
            .list_children(parent_id, subagents::CancellationToken::new()),
    )
    .await
    .unwrap();
    assert!(
        matches!(listed.as_slice(), [SubagentListEntry::Child { id, .. }] if *id == child),
        "{listed:?}"
    );
    assert_eq!(
        store.events_read(parent_id) - before,
        0,
        "none of the seed is read"
    );
    assert!(
        store.events_read(child) <= 5,
        "of the child, its creation batch: {}",
        store.events_read(child)
    );

    let own = store.read_own(child).await.unwrap();
    assert_eq!(own.header.id, child);
    assert_eq!(own.events.first().map(|event| event.seq), Some(seed_length));
    assert!(matches!(own.events[0].kind, EventKind::EndSeed {}));
    assert_eq!(own.seed_shape.last_turn(), 10);
    assert!(own.seed_shape.is_balanced());
    within("shutdown", rt.shutdown()).await.unwrap();
}

// A reference whose prefix is not the one it names reads as STORE_CORRUPT for that session
// only: never a log assembled from someone else's events.
#[actix_rt::test]
async fn a_reference_to_a_changed_prefix_is_corrupt_for_its_own_session() {
    let store = MemoryStore::new();
    let sound = stored_pair(&store, |_| {}).await;
    assert_eq!(store.read_from(sound, 0).await.unwrap().len(), 3);
    let changed = stored_pair(&store, |reference| reference.tail ^= 1).await;
    let error = store
        .read_from(changed, 0)
        .await
        .expect_err("the digest differs");
    assert_eq!(error.code(), ErrorCode::StoreCorrupt);
    assert!(error.message().contains("missing or changed"), "{error}");
    assert_eq!(
        store.read_from(changed, 2).await.unwrap().len(),
        1,
        "the child's own events still read"
    );
    let own = store.read_own(sound).await.unwrap();
    assert_eq!((own.events.len(), own.seed_shape.last_turn()), (1, 1));
    let error = store
        .read_own(changed)
        .await
        .expect_err("its own events are read only behind a sound seed");
    assert_eq!(error.code(), ErrorCode::StoreCorrupt);
    let unknown = stored_pair(&store, |reference| reference.session = SessionId::new()).await;
    let error = store.inspect(unknown).await.expect_err("no such parent");
    assert_eq!(
        error.code(),
        ErrorCode::StoreCorrupt,
        "the child is stored; its seed is what is missing"
    );
    let error = store
        .inspect_own(unknown)
        .await
        .expect_err("no such parent");
    assert_eq!(error.code(), ErrorCode::StoreCorrupt);
}

// The creation checks what a reference claims against the header it is stored in.
#[actix_rt::test]
async fn a_reference_that_disagrees_with_the_seed_length_is_an_invalid_header() {
    let store = MemoryStore::new();
    let mut header = SessionHeader::new(SessionId::new());
    header.seed_length = Some(3);
    header.seed_reference = Some(Box::new(SeedReference {
        session: SessionId::new(),
        length: 2,
        tail: 0,
        links: 1,
    }));
    let error = store.create(header, Vec::new()).await.expect_err("2 ≠ 3");
    assert_eq!(error.code(), ErrorCode::InvalidHeader);
}

// A store that lets disposed one-shot sessions go keeps one while a stored seed references it,
// and lets it go with the last such seed.
#[actix_rt::test]
async fn a_forgetting_store_keeps_a_disposed_session_a_seed_references() {
    let store = MemoryStore::forgetting_one_shots();
    let child = stored_pair(&store, |_| {}).await;
    let parent = store.header(child).await.unwrap().parent_session.unwrap();
    store.one_shot_disposed(parent);
    assert_eq!(
        store.read_from(child, 0).await.unwrap().len(),
        3,
        "the disposed parent's prefix still resolves"
    );
    store.one_shot_disposed(child);
    for id in [child, parent] {
        let error = store.header(id).await.expect_err("both are gone");
        assert_eq!(error.code(), ErrorCode::SessionNotFound);
    }
}

/// A fork that a fork starts during its own first turn: its seed is its parent's completed
/// turns, all of them inherited, so the prefix it references lies inside its parent's own
/// seed, where the parent's store holds no row. Every store must read it back through the chain.
async fn a_fork_of_a_fork_mid_turn_on(store: Arc<dyn SessionPersistence>) {
    let (rt, model) = runtime_on(Arc::clone(&store)).await;
    let parent = root(&rt).await;
    run_prompt(parent.agent(), "the parent's turn").await;
    let gate = Gate::new();
    model.push(ScriptStep::text("held").gated(&gate));
    let spec = |parent: &subagents::AgentRef, label: &str| {
        ContinuableStartSpec::new("fork", label, parent, text(label))
    };
    let child = rt
        .subagents()
        .start_continuable(spec(parent.agent(), "child fork"))
        .await
        .expect("the child fork starts")
        .child_id;
    gate.reached().await;
    let live_child = rt.agents().get(child).await.expect("the child is mid-turn");
    let grandchild = rt
        .subagents()
        .start_continuable(spec(&live_child, "grandchild fork"))
        .await
        .expect("the grandchild fork starts")
        .child_id;
    let reference = store
        .header(grandchild)
        .await
        .unwrap()
        .seed_reference
        .expect("stored by reference");
    let child_header = store.header(child).await.unwrap();
    assert_eq!(reference.session, child);
    assert!(
        reference.length <= child_header.seed_len(),
        "the referenced prefix lies inside the child's own seed"
    );
    gate.release();
    let events = within("the grandchild's log", store.read_from(grandchild, 0))
        .await
        .expect("the chain resolves");
    // The parent's log has grown since (its children's notices): compare what the child
    // inherited when it forked, which the grandchild inherits in turn.
    let inherited = usize::try_from(child_header.seed_len()).unwrap();
    let parents = store.read_from(parent.agent().id(), 0).await.unwrap();
    assert!(
        events.len() > inherited,
        "the grandchild holds the parent's turns and its own prompt"
    );
    assert_eq!(plain(&events[..inherited]), plain(&parents[..inherited]));
    rt.shutdown().await.unwrap();
}

#[actix_rt::test]
async fn a_fork_of_a_fork_mid_turn_resolves_on_the_memory_store() {
    a_fork_of_a_fork_mid_turn_on(Arc::new(MemoryStore::new())).await;
}

// On sled (and PostgreSQL) a read that lay wholly inside a seed stored by reference found no
// row and was refused as STORE_CORRUPT ("0 events stored from 0, its head says N"): found by
// `subagents check --seed 37 --store sled`.
#[actix_rt::test]
async fn a_fork_of_a_fork_mid_turn_resolves_on_the_sled_store() {
    let dir = tempfile::tempdir().unwrap();
    a_fork_of_a_fork_mid_turn_on(Arc::new(SledStore::open(dir.path()).unwrap())).await;
}

#[actix_rt::test]
async fn a_fork_of_a_fork_mid_turn_resolves_on_the_postgres_store() {
    let url = postgres_or_skip!().fresh_database();
    let store = PostgresStore::connect(&url).await.unwrap();
    a_fork_of_a_fork_mid_turn_on(Arc::new(store)).await;
}
