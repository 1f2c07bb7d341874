//! Stores: both backends against a model, compare-and-append, leases, corruption, repair and
//! durability.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use proptest::prelude::*;
use subagents::content::Message;
use subagents::store::{EncodedRow, LeaseEpoch, LeaseHolder, ListedSession, PostgresStore};
use subagents::testing::{FaultInjectingStore, ScriptStep, ScriptedModel, StoreOperation};
use subagents::{
    ContentBlock, CreateAgent, ErrorCode, EventKind, MemoryStore, MessageSource, Runtime,
    SessionEvent, SessionHeader, SessionId, SessionPersistence, SledStore, TurnEndReason,
};

use crate::support::run_prompt;

fn note(seq: u64, label: &str) -> SessionEvent {
    SessionEvent::new(
        seq,
        EventKind::UserMessage(Message::user(
            vec![ContentBlock::text(label)],
            MessageSource::User,
        )),
    )
}

pub(crate) fn notes(from: u64, count: u64) -> Vec<Arc<SessionEvent>> {
    (from..from + count)
        .map(|seq| Arc::new(note(seq, &format!("n{seq}"))))
        .collect()
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Create(usize),
    Append {
        session: usize,
        count: u64,
        skew: i8,
    },
    Read {
        session: usize,
        from: u64,
    },
    Flush(usize),
    Reopen,
    /// Only for stores that can crash: reopen what a killed process leaves, unflushed.
    Crash,
}

/// A session of the model: its events, and how many of them a flush covered.
#[derive(Debug, Default, Clone)]
struct ModelSession {
    events: Vec<String>,
    flushed: usize,
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4usize).prop_map(Op::Create),
        (
            0..4usize,
            1..5u64,
            prop_oneof![Just(0i8), Just(0), Just(0), Just(-1), Just(1)]
        )
            .prop_map(|(session, count, skew)| Op::Append {
                session,
                count,
                skew
            }),
        (0..4usize, 0..12u64).prop_map(|(session, from)| Op::Read { session, from }),
        (0..4usize).prop_map(Op::Flush),
        Just(Op::Reopen),
    ]
}

/// The sled model's extra operation: a crash (the directory as the OS holds it, with no flush).
fn op_or_crash() -> impl Strategy<Value = Op> {
    prop_oneof![4 => op(), 1 => Just(Op::Crash)]
}

/// Runs `ops` against `store` and a `BTreeMap` model, checking every answer.
///
/// `crash` opens the store a killed process would leave: every session must then read back as a
/// prefix of its model log that holds at least every flushed event, and the model adopts it.
pub(crate) fn check_against_model(
    ops: &[Op],
    mut store: Arc<dyn SessionPersistence>,
    reopen: &dyn Fn(Arc<dyn SessionPersistence>) -> Arc<dyn SessionPersistence>,
    crash: &dyn Fn() -> Arc<dyn SessionPersistence>,
) {
    let ids: Vec<SessionId> = (0..4).map(|_| SessionId::new()).collect();
    let mut model: BTreeMap<SessionId, ModelSession> = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Create(session) => {
                let id = ids[session];
                let outcome = block_on(store.create(SessionHeader::new(id), notes(0, 1)));
                match model.entry(id) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        assert_eq!(outcome.unwrap_err().code(), ErrorCode::SessionExists);
                    }
                    std::collections::btree_map::Entry::Vacant(slot) => {
                        outcome.unwrap();
                        slot.insert(ModelSession {
                            events: vec!["n0".into()],
                            flushed: 0,
                        });
                    }
                }
            }
            Op::Append {
                session,
                count,
                skew,
            } => {
                let id = ids[session];
                let next = model
                    .get(&id)
                    .map_or(0, |session| u64::try_from(session.events.len()).unwrap());
                let expected = next.saturating_add_signed(i64::from(skew));
                let outcome = block_on(store.append(id, expected, notes(expected, count), None));
                match model.get_mut(&id) {
                    None => assert_eq!(outcome.unwrap_err().code(), ErrorCode::SessionNotFound),
                    Some(_) if expected != next => {
                        assert_eq!(outcome.unwrap_err().code(), ErrorCode::StoreConflict)
                    }
                    Some(session) => {
                        outcome.unwrap();
                        session
                            .events
                            .extend((expected..expected + count).map(|seq| format!("n{seq}")));
                    }
                }
            }
            Op::Read { session, from } => {
                let id = ids[session];
                let outcome = block_on(store.read_from(id, from));
                match model.get(&id) {
                    None => assert_eq!(outcome.unwrap_err().code(), ErrorCode::SessionNotFound),
                    Some(session) => {
                        let got = labelled(outcome.unwrap());
                        let want: Vec<(u64, String)> = session
                            .events
                            .iter()
                            .enumerate()
                            .map(|(seq, label)| (u64::try_from(seq).unwrap(), label.clone()))
                            .skip(usize::try_from(from).unwrap())
                            .collect();
                        assert_eq!(got, want);
                    }
                }
            }
            Op::Flush(session) => {
                let id = ids[session];
                let outcome = block_on(store.flush(id));
                if let Some(session) = model.get_mut(&id) {
                    outcome.unwrap();
                    session.flushed = session.events.len();
                }
            }
            Op::Reopen => {
                for (id, session) in &mut model {
                    block_on(store.flush(*id)).unwrap();
                    session.flushed = session.events.len();
                }
                store = reopen(store);
            }
            Op::Crash => {
                store = crash();
                for (id, session) in std::mem::take(&mut model) {
                    let survived = match block_on(store.read_from(id, 0)) {
                        Ok(events) => labelled(events),
                        Err(error) => {
                            assert_eq!(error.code(), ErrorCode::SessionNotFound);
                            assert_eq!(session.flushed, 0, "a flushed session survives a crash");
                            continue;
                        }
                    };
                    let labels: Vec<String> = survived.into_iter().map(|(_, l)| l).collect();
                    assert!(
                        labels.len() >= session.flushed,
                        "every flushed event survives: {} < {}",
                        labels.len(),
                        session.flushed
                    );
                    assert_eq!(
                        labels[..],
                        session.events[..labels.len()],
                        "what survives is a prefix of what was written"
                    );
                    let flushed = labels.len();
                    model.insert(
                        id,
                        ModelSession {
                            events: labels,
                            flushed,
                        },
                    );
                }
            }
        }
    }
    let listed: Vec<SessionId> = block_on(store.list())
        .unwrap()
        .iter()
        .filter_map(ListedSession::id)
        .collect();
    let mut want: Vec<SessionId> = model.keys().copied().collect();
    let mut got = listed;
    want.sort();
    got.sort();
    assert_eq!(got, want, "list shows exactly the created sessions");
}

/// The seq and label of each event of a model log.
fn labelled(events: Vec<Arc<SessionEvent>>) -> Vec<(u64, String)> {
    events
        .iter()
        .map(|e| match &e.kind {
            EventKind::UserMessage(m) => (e.seq, m.text()),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

/// Copies a live sled directory as the OS holds it: what a process killed now leaves behind.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_store_acts_like_the_model(ops in prop::collection::vec(op(), 1..40)) {
        check_against_model(&ops, Arc::new(MemoryStore::new()), &|store| store, &|| unreachable!("op() never crashes"));
    }

    #[test]
    fn the_sled_store_acts_like_the_model_even_across_reopens_and_crashes(
        ops in prop::collection::vec(op_or_crash(), 1..40)
    ) {
        let root = tempfile::tempdir().unwrap();
        let generation = std::cell::Cell::new(0u32);
        let path = move |generation: u32| root.path().join(format!("g{generation}"));
        let first = path(0);
        let store: Arc<dyn SessionPersistence> = Arc::new(SledStore::open(&first).unwrap());
        let current = std::cell::RefCell::new(first);
        check_against_model(
            &ops,
            store,
            &|old| {
                drop(old);
                Arc::new(SledStore::open(&*current.borrow()).unwrap())
            },
            &|| {
                // The live store stays open until replaced (a killed process never flushes on
                // its way out); the copy is what the OS held at the kill.
                generation.set(generation.get() + 1);
                let next = path(generation.get());
                copy_dir(&current.borrow(), &next);
                *current.borrow_mut() = next;
                Arc::new(SledStore::open(&*current.borrow()).unwrap())
            },
        );
    }
}

/// A backend of the shared suite: a store, and a way to open it again as a new process would
/// (`None` for the memory store, which lives only as long as itself).
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) store: Arc<dyn SessionPersistence>,
    pub(crate) reopen: Option<Box<dyn Fn() -> Arc<dyn SessionPersistence>>>,
    /// The sled directory, removed with the backend.
    pub(crate) _dir: Option<tempfile::TempDir>,
}

/// A runtime PostgreSQL's connections run on, entered for the caller's thread, so the
/// synchronous tests drive every backend with `block_on`.
pub(crate) fn store_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Every backend: memory, sled (a fresh directory), PostgreSQL (a fresh database). Call with
/// [`store_runtime`] entered.
pub(crate) fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    // Without PostgreSQL installed, the other backends still run (its absence said once).
    let url = crate::support::postgres::available().map(|server| server.fresh_database());
    let sled_dir = dir.path().to_owned();
    let mut backends = vec![
        Backend {
            name: "memory",
            store: Arc::new(MemoryStore::new()),
            reopen: None,
            _dir: None,
        },
        Backend {
            name: "sled",
            store: Arc::new(SledStore::open(dir.path()).unwrap()),
            reopen: Some(Box::new(move || {
                Arc::new(SledStore::open(&sled_dir).unwrap())
            })),
            _dir: Some(dir),
        },
    ];
    if let Some(url) = url {
        backends.push(Backend {
            name: "postgres",
            store: Arc::new(block_on(PostgresStore::connect(&url)).unwrap()),
            reopen: Some(Box::new(move || {
                Arc::new(block_on(PostgresStore::connect(&url)).unwrap())
            })),
            _dir: None,
        });
    }
    backends
}

#[test]
fn a_lease_fences_out_older_epochs_and_refuses_a_second_holder() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { name, store, .. } in backends() {
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
        let runtime = LeaseHolder::new();
        let first = block_on(store.acquire_lease(id, runtime.clone())).unwrap();
        let second = block_on(store.acquire_lease(id, runtime.clone())).unwrap();
        assert!(second.epoch > first.epoch, "each grant is a newer epoch");
        assert_eq!(
            second.ttl.is_some(),
            name == "postgres",
            "{name}: embedded leases need no renewal, networked ones expire"
        );

        let stale = block_on(store.append(id, 0, notes(0, 1), Some(first.epoch))).unwrap_err();
        assert_eq!(stale.code(), ErrorCode::LeaseLost);
        block_on(store.append(id, 0, notes(0, 1), Some(second.epoch))).unwrap();
        assert_eq!(
            block_on(store.read_from(id, 0)).unwrap().len(),
            1,
            "the stale write left nothing"
        );

        let other = LeaseHolder::new();
        let refused = block_on(store.acquire_lease(id, other.clone())).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::SessionLeased);
        let renewed_stale = block_on(store.renew_lease(id, first.epoch)).unwrap_err();
        assert_eq!(renewed_stale.code(), ErrorCode::LeaseLost);

        // A stale release is a no-op; the current one frees the lease.
        block_on(store.release_lease(id, first.epoch)).unwrap();
        assert_eq!(
            block_on(store.acquire_lease(id, other.clone()))
                .unwrap_err()
                .code(),
            ErrorCode::SessionLeased
        );
        block_on(store.release_lease(id, second.epoch)).unwrap();
        let taken = block_on(store.acquire_lease(id, other.clone())).unwrap();
        assert!(taken.epoch > second.epoch);

        // A holder that is gone (its runtime dropped) holds nothing.
        drop(other);
        let third = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
        assert!(third.epoch > taken.epoch);
    }
}

// A projection-cache row is fenced like an append: a runtime that released the session (its
// disposal checkpoint comes after the release) or lost it cannot overwrite the row of a newer
// holder; the current epoch writes, and an unfenced write (a host's own) still does.
#[test]
fn a_checkpoint_write_is_fenced_by_the_lease_epoch() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { name, store, .. } in backends() {
        let id = SessionId::new();
        let old = block_on(store.create_leased(SessionHeader::new(id), vec![], LeaseHolder::new()))
            .unwrap();
        block_on(store.cache_put(
            "checkpoint",
            id,
            serde_json::json!({"by": "old"}),
            Some(old.epoch),
        ))
        .unwrap_or_else(|error| panic!("{name}: the holder writes: {error}"));
        block_on(store.release_lease(id, old.epoch)).unwrap();
        let new = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
        block_on(store.cache_put(
            "checkpoint",
            id,
            serde_json::json!({"by": "new"}),
            Some(new.epoch),
        ))
        .unwrap();
        let stale = block_on(store.cache_put(
            "checkpoint",
            id,
            serde_json::json!({"by": "old, late"}),
            Some(old.epoch),
        ))
        .unwrap_err();
        assert_eq!(stale.code(), ErrorCode::LeaseLost, "{name}");
        // The runtime's checkpoints arrive encoded: fenced the same way.
        let stale = block_on(store.cache_put_encoded(
            "checkpoint",
            id,
            EncodedRow::from_json(br#"{"by": "old, encoded"}"#.to_vec()).unwrap(),
            Some(old.epoch),
        ))
        .unwrap_err();
        assert_eq!(stale.code(), ErrorCode::LeaseLost, "{name}: encoded");
        assert_eq!(
            block_on(store.cache_get("checkpoint", id)).unwrap(),
            Some(serde_json::json!({"by": "new"})),
            "{name}: the newer holder's row stands"
        );
        block_on(store.cache_put_encoded(
            "checkpoint",
            id,
            EncodedRow::from_json(br#"{"by": "new, encoded"}"#.to_vec()).unwrap(),
            Some(new.epoch),
        ))
        .unwrap_or_else(|error| panic!("{name}: the holder writes encoded: {error}"));
        assert_eq!(
            block_on(store.cache_get("checkpoint", id)).unwrap(),
            Some(serde_json::json!({"by": "new, encoded"})),
            "{name}: an encoded row reads back as the value it encodes"
        );
        let encoded = block_on(store.cache_get_encoded("checkpoint", id))
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: the row reads back encoded"));
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(encoded.as_bytes()).unwrap(),
            serde_json::json!({"by": "new, encoded"}),
            "{name}: the encoded read holds the row written"
        );
        assert!(
            block_on(store.cache_get_encoded("timing", id))
                .unwrap()
                .is_none(),
            "{name}: no row of another unit"
        );
        let missing = SessionId::new();
        assert!(
            block_on(store.cache_put(
                "checkpoint",
                missing,
                serde_json::json!({}),
                Some(new.epoch)
            ))
            .is_err(),
            "{name}: a fenced write names a stored session"
        );
        block_on(store.cache_put("checkpoint", missing, serde_json::json!({}), None))
            .unwrap_or_else(|error| panic!("{name}: an unfenced write lands: {error}"));
    }
}

// A leased writer's next append is checked against the head as stored: after a leased
// creation, after a write without a lease moved it, and under a newer lease. (A store that
// keeps heads in memory to spare a read must see every head it writes.)
#[test]
fn a_leased_append_sees_every_write_that_moved_the_head() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { name, store, .. } in backends() {
        let id = SessionId::new();
        let holder = LeaseHolder::new();
        let created = block_on(store.create_leased(
            SessionHeader::new(id),
            notes(0, 2).into_iter().collect(),
            holder.clone(),
        ))
        .unwrap();
        let stale = block_on(store.append(id, 0, notes(0, 1), Some(created.epoch))).unwrap_err();
        assert_eq!(stale.code(), ErrorCode::StoreConflict, "{name}");
        block_on(store.append(id, 2, notes(2, 1), Some(created.epoch))).unwrap();
        // Without a lease, the head moves to 4.
        block_on(store.append(id, 3, notes(3, 1), None)).unwrap();
        let behind = block_on(store.append(id, 3, notes(3, 1), Some(created.epoch))).unwrap_err();
        assert_eq!(
            behind.code(),
            ErrorCode::StoreConflict,
            "{name}: a stale head was used"
        );
        block_on(store.append(id, 4, notes(4, 1), Some(created.epoch))).unwrap();
        let again = block_on(store.acquire_lease(id, holder.clone())).unwrap();
        let behind = block_on(store.append(id, 4, notes(4, 1), Some(again.epoch))).unwrap_err();
        assert_eq!(behind.code(), ErrorCode::StoreConflict, "{name}");
        block_on(store.append(id, 5, notes(5, 1), Some(again.epoch))).unwrap();
        assert_eq!(
            labelled(block_on(store.read_from(id, 0)).unwrap()).len(),
            6,
            "{name}: each event once, in order"
        );
    }
}

#[test]
fn the_fencing_epoch_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::new();
    let before = {
        let store = SledStore::open(dir.path()).unwrap();
        block_on(store.create(SessionHeader::new(id), notes(0, 1))).unwrap();
        let lease = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
        block_on(store.flush(id)).unwrap();
        lease
    };
    let store = SledStore::open(dir.path()).unwrap();
    // The process that held it is gone: the lease is free, and its epoch is fenced.
    let after = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
    assert!(after.epoch > before.epoch);
    let stale = block_on(store.append(id, 1, notes(1, 1), Some(before.epoch))).unwrap_err();
    assert_eq!(stale.code(), ErrorCode::LeaseLost);
}

#[actix_rt::test]
async fn a_lease_with_a_ttl_expires_unless_renewed() {
    tokio::time::pause();
    let store = MemoryStore::with_lease_ttl(Duration::from_secs(30));
    let id = SessionId::new();
    store.create(SessionHeader::new(id), vec![]).await.unwrap();
    let owner = LeaseHolder::new();
    let first = store.acquire_lease(id, owner.clone()).await.unwrap();
    assert_eq!(first.ttl, Some(Duration::from_secs(30)));
    let holder = LeaseHolder::new();
    tokio::time::advance(Duration::from_secs(20)).await;
    store.renew_lease(id, first.epoch).await.unwrap();
    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(
        store
            .acquire_lease(id, holder.clone())
            .await
            .unwrap_err()
            .code(),
        ErrorCode::SessionLeased,
        "a renewed lease is still held"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    let taken = store.acquire_lease(id, holder).await.unwrap();
    assert!(taken.epoch > first.epoch, "an expired lease is taken over");
    drop(owner);
    assert_eq!(
        store.renew_lease(id, first.epoch).await.unwrap_err().code(),
        ErrorCode::LeaseLost
    );
}

#[test]
fn children_are_listed_by_parent_without_reading_logs() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { store, .. } in backends() {
        let parent = SessionId::new();
        block_on(store.create(SessionHeader::new(parent), notes(0, 1))).unwrap();
        let mut children = Vec::new();
        for _ in 0..3 {
            let mut header = SessionHeader::new(SessionId::new());
            header.parent_session = Some(parent);
            children.push(header.id);
            block_on(store.create(header, notes(0, 1))).unwrap();
        }
        let mut silent = SessionHeader::new(SessionId::new());
        silent.parent_session = Some(parent);
        block_on(store.create(silent, vec![])).unwrap();
        let mut listed: Vec<SessionId> = block_on(store.list_children(parent))
            .unwrap()
            .iter()
            .filter_map(ListedSession::id)
            .collect();
        listed.sort();
        children.sort();
        assert_eq!(listed, children);
        assert!(block_on(store.list_children(children[0]))
            .unwrap()
            .is_empty());
        let all: Vec<SessionId> = block_on(store.list())
            .unwrap()
            .iter()
            .filter_map(ListedSession::id)
            .collect();
        assert_eq!(
            all.len(),
            4,
            "the parent and its three children, not the silent one"
        );
    }
}

/// Opens a store's directory as a raw sled database. A store dropped in this process frees the
/// directory lock only once sled's flusher thread has stopped: retry the lock as
/// `SledStore::open` does.
fn open_raw(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + SledStore::LOCK_WAIT;
    loop {
        match sled::open(path) {
            Ok(db) => break db,
            Err(error) if std::time::Instant::now() < deadline => {
                drop(error);
                std::thread::park_timeout(Duration::from_millis(5));
            }
            Err(error) => panic!("opening {}: {error}", path.display()),
        }
    }
}

/// Rewrites one raw sled value, as a torn disk or a bad tool would.
fn corrupt(path: &std::path::Path, tree: &str, key: Vec<u8>) {
    let db = open_raw(path);
    db.open_tree(tree)
        .unwrap()
        .insert(key, b"{not json".to_vec())
        .unwrap();
    db.flush().unwrap();
}

#[test]
fn a_corrupt_record_is_a_typed_error_for_its_session_only() {
    let dir = tempfile::tempdir().unwrap();
    let (bad, good) = (SessionId::new(), SessionId::new());
    {
        let store = SledStore::open(dir.path()).unwrap();
        for id in [bad, good] {
            block_on(store.create(SessionHeader::new(id), notes(0, 3))).unwrap();
        }
        block_on(store.flush(bad)).unwrap();
    }
    // The creation's events are one row, keyed by its first seq.
    let mut key = bad.as_bytes().to_vec();
    key.extend_from_slice(&0u64.to_be_bytes());
    corrupt(dir.path(), "event_batches", key);
    let store = SledStore::open(dir.path()).unwrap();
    let error = block_on(store.read_from(bad, 0)).unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreCorrupt);
    assert!(
        error.message().contains("the events from 0 do not decode"),
        "{error}"
    );
    assert_eq!(
        block_on(store.inspect(bad)).unwrap_err().code(),
        ErrorCode::StoreCorrupt
    );
    assert_eq!(
        block_on(store.read_from(good, 0)).unwrap().len(),
        3,
        "the other session is intact"
    );
    drop(store);

    corrupt(dir.path(), "headers", bad.as_bytes().to_vec());
    let store = SledStore::open(dir.path()).unwrap();
    let listed = block_on(store.list()).unwrap();
    assert_eq!(listed.len(), 2, "a corrupt header hides no other session");
    assert!(listed.iter().any(|row| matches!(row, ListedSession::Corrupt { id: Some(id), error } if *id == bad && error.code() == ErrorCode::StoreCorrupt)));
    assert!(listed
        .iter()
        .any(|row| row.header().is_some_and(|h| h.id == good)));
}

fn open_turn_events() -> Vec<Arc<SessionEvent>> {
    vec![
        Arc::new(SessionEvent::new(0, EventKind::TurnStart { turn: 1 })),
        Arc::new(SessionEvent::new(
            1,
            EventKind::StepStart { turn: 1, step: 1 },
        )),
    ]
}

#[test]
fn inspect_repairs_in_memory_and_prepare_repairs_durably() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend {
        name,
        store,
        reopen,
        ..
    } in backends()
    {
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), open_turn_events())).unwrap();
        let inspected = block_on(store.inspect(id)).unwrap();
        assert_eq!(
            inspected.events.len(),
            4,
            "{name}: step/end and turn/end were added"
        );
        assert_eq!(
            block_on(store.read_from(id, 0)).unwrap().len(),
            2,
            "{name}: inspect commits nothing"
        );
        let prepared = block_on(store.prepare(id, None)).unwrap();
        let kinds = |events: &[Arc<SessionEvent>]| {
            events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(&prepared.events),
            kinds(&inspected.events),
            "{name}: both agree"
        );
        assert!(matches!(
            prepared.events[3].kind,
            EventKind::TurnEnd {
                reason: TurnEndReason::Interrupted,
                ..
            }
        ));
        let Some(reopen) = reopen else { continue };
        drop(store);
        let reopened = reopen();
        assert_eq!(
            block_on(reopened.read_from(id, 0)).unwrap().len(),
            4,
            "{name}: the repair survived a reopen"
        );
        assert_eq!(
            block_on(reopened.prepare(id, None)).unwrap().events.len(),
            4,
            "{name}: repair happens once"
        );
    }
}

#[test]
fn flushed_writes_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::new();
    {
        let store = SledStore::open(dir.path()).unwrap();
        block_on(store.create(SessionHeader::new(id), notes(0, 2))).unwrap();
        block_on(store.append(id, 2, notes(2, 3), None)).unwrap();
        block_on(store.flush(id)).unwrap();
    }
    let store = SledStore::open(dir.path()).unwrap();
    let labels = |events: Vec<Arc<SessionEvent>>| {
        events
            .iter()
            .map(|e| match &e.kind {
                EventKind::UserMessage(m) => (e.seq, m.text()),
                other => panic!("unexpected {other:?}"),
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        labels(block_on(store.read_from(id, 0)).unwrap()),
        labels(notes(0, 5))
    );
    assert_eq!(
        block_on(store.read_from(id, 3))
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect::<Vec<_>>(),
        [3, 4]
    );
}

#[test]
fn a_bad_header_is_refused_at_create() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { store, .. } in backends() {
        bad_headers_are_refused(&*store);
    }
}

fn bad_headers_are_refused(store: &dyn SessionPersistence) {
    let mut header = SessionHeader::new(SessionId::new());
    header.cwd = Some("not/absolute".into());
    assert_eq!(
        block_on(store.create(header, vec![])).unwrap_err().code(),
        ErrorCode::InvalidHeader
    );
    let gap = vec![Arc::new(note(1, "x"))];
    assert_eq!(
        block_on(store.create(SessionHeader::new(SessionId::new()), gap))
            .unwrap_err()
            .code(),
        ErrorCode::StoreConflict
    );
}

#[actix_rt::test]
async fn a_failed_write_behind_surfaces_at_the_next_flush() {
    let faults = Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())));
    let model = ScriptedModel::with_script([ScriptStep::text("ok")]);
    let rt = Runtime::builder()
        .shared_store(faults.clone())
        .model("scripted", model)
        .build()
        .unwrap();
    let handle = rt.agents().create(CreateAgent::new()).await.unwrap();
    faults.arm(StoreOperation::Append);
    run_prompt(handle.agent(), "x").await;
    let error = handle.agent().log().flush().await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreIo);
    assert_eq!(
        handle.dispose().await.unwrap_err().code(),
        ErrorCode::StoreIo,
        "dispose reports the lost writes"
    );
}

#[test]
fn events_past_the_head_are_an_unfinished_append_and_stay_invisible() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::new();
    {
        let store = SledStore::open(dir.path()).unwrap();
        block_on(store.create(SessionHeader::new(id), notes(0, 2))).unwrap();
        block_on(store.flush(id)).unwrap();
    }
    // A crash between an append's event batch and its head update leaves events past the head.
    {
        let db = open_raw(dir.path());
        let batches = db.open_tree("event_batches").unwrap();
        let mut key = id.as_bytes().to_vec();
        key.extend_from_slice(&2u64.to_be_bytes());
        batches
            .insert(key, serde_json::to_vec(&[note(2, "orphan")]).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    let store = SledStore::open(dir.path()).unwrap();
    assert_eq!(
        block_on(store.read_from(id, 0)).unwrap().len(),
        2,
        "the orphan is not part of the log"
    );
    block_on(store.append(id, 2, notes(2, 1), None)).unwrap();
    let events = block_on(store.read_from(id, 0)).unwrap();
    assert!(
        matches!(&events[2].kind, EventKind::UserMessage(m) if m.text() == "n2"),
        "the next append replaced it"
    );
}

#[test]
fn a_store_in_the_per_event_layout_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open_raw(dir.path());
        db.open_tree("events")
            .unwrap()
            .insert(b"old row", b"{}".to_vec())
            .unwrap();
        db.flush().unwrap();
    }
    let error = SledStore::open(dir.path()).unwrap_err();
    assert_eq!(error.code(), ErrorCode::StoreCorrupt);
    assert!(error.message().contains("per-event layout"), "{error}");
}

#[test]
fn a_read_from_the_middle_of_an_append_returns_exactly_the_rest() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { name, store, .. } in backends() {
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), notes(0, 3))).unwrap();
        block_on(store.append(id, 3, notes(3, 4), None)).unwrap();
        for from in 0..=8u64 {
            let seqs: Vec<u64> = block_on(store.read_from(id, from))
                .unwrap()
                .iter()
                .map(|event| event.seq)
                .collect();
            assert_eq!(
                seqs,
                (from.min(7)..7).collect::<Vec<_>>(),
                "{name}: from {from}"
            );
        }
    }
}

#[test]
fn a_leased_creation_grants_the_first_epoch_in_the_same_write() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend {
        name,
        store,
        reopen,
        ..
    } in backends()
    {
        let Some(reopen) = reopen else { continue };
        let id = SessionId::new();
        let holder = LeaseHolder::new();
        let lease =
            block_on(store.create_leased(SessionHeader::new(id), notes(0, 2), holder.clone()))
                .unwrap();
        let refused = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap_err();
        assert_eq!(
            refused.code(),
            ErrorCode::SessionLeased,
            "{name}: the lease is held"
        );
        block_on(store.append(id, 2, notes(2, 1), Some(lease.epoch))).unwrap();
        // Creating the same id again is refused and grants nothing.
        let again =
            block_on(store.create_leased(SessionHeader::new(id), vec![], LeaseHolder::new()));
        assert_eq!(again.unwrap_err().code(), ErrorCode::SessionExists);
        block_on(store.flush(id)).unwrap();
        block_on(store.release_lease(id, lease.epoch)).unwrap();
        drop(store);
        drop(holder);
        // The epoch is durable: after a reopen the next grant fences the first one out.
        let store = reopen();
        let next = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
        let stale = block_on(store.append(id, 3, notes(3, 1), Some(LeaseEpoch(1)))).unwrap_err();
        assert_eq!(stale.code(), ErrorCode::LeaseLost, "{name}");
        assert!(next.epoch > LeaseEpoch(1));
        assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 3);
    }
}

// A sled store sled cannot read says so as damage, names the directory and what to do, and
// changes nothing (it was a bare I/O error: "Read corrupted data at file offset None").
#[test]
fn a_damaged_sled_store_is_refused_as_corrupt_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path()).unwrap());
    let conf = dir.path().join("conf");
    let mut damaged = std::fs::read(&conf).unwrap();
    damaged[5..12].copy_from_slice(b"garbage");
    std::fs::write(&conf, &damaged).unwrap();
    let Err(error) = SledStore::open(dir.path()) else {
        panic!("a damaged store is refused");
    };
    assert_eq!(error.code(), ErrorCode::StoreCorrupt, "{error}");
    assert!(
        error.message().contains(&dir.path().display().to_string())
            && error
                .message()
                .contains("open a new store in another directory"),
        "{error}"
    );
    assert_eq!(
        std::fs::read(&conf).unwrap(),
        damaged,
        "nothing was changed"
    );
}

// A resume inspects a log before it takes the lease; what another writer appended in between
// is read after the grant on every store, whether or not the grant told the log's length
// (PostgreSQL's does, and a log that did not grow is then not read again).
#[test]
fn what_was_appended_between_an_inspection_and_the_lease_is_loaded() {
    let runtime = store_runtime();
    let _entered = runtime.enter();
    for Backend { name, store, .. } in backends() {
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), notes(0, 2))).unwrap();
        let inspected = block_on(store.inspect(id)).unwrap();
        assert_eq!(inspected.events.len(), 2, "{name}");
        // Another writer appends before this resume's lease is granted.
        let writer = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
        block_on(store.append(id, 2, notes(2, 1), Some(writer.epoch))).unwrap();
        block_on(store.release_lease(id, writer.epoch)).unwrap();

        let (lease, stored_len) =
            block_on(store.acquire_lease_with_length(id, LeaseHolder::new())).unwrap();
        assert!(
            stored_len.is_none_or(|len| len == 3),
            "{name}: a length told is the log's at the grant: {stored_len:?}"
        );
        let loaded =
            block_on(store.prepare_inspected(id, Some(lease.epoch), inspected.clone(), stored_len))
                .unwrap();
        assert_eq!(loaded.events.len(), 3, "{name}: the append is loaded");

        // Nothing appended since: the inspection is the log.
        let inspected = block_on(store.inspect(id)).unwrap();
        block_on(store.release_lease(id, lease.epoch)).unwrap();
        let (lease, stored_len) =
            block_on(store.acquire_lease_with_length(id, LeaseHolder::new())).unwrap();
        let loaded =
            block_on(store.prepare_inspected(id, Some(lease.epoch), inspected, stored_len))
                .unwrap();
        assert_eq!(loaded.events.len(), 3, "{name}");
        assert_eq!(
            stored_len.is_some(),
            name == "postgres",
            "{name}: only PostgreSQL's grant tells the length"
        );
    }
}
