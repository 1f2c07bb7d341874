//! `PostgresStore` on a throwaway server: the model test every store passes, compare-and-append
//! and fencing, leases that expire, listing, corruption, repair.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use proptest::prelude::*;
use subagents::store::{
    BatchedCalls, LeaseEpoch, LeaseHolder, ListedSession, PostgresConfig, PostgresStore,
};
use subagents::{ErrorCode, SessionEvent, SessionHeader, SessionId, SessionPersistence};

use crate::store::{check_against_model, notes, op};
use crate::support::postgres::{
    holding_lease_row, holding_session_row, postgres_or_skip, raw_client,
};
use crate::support::within;

use crate::store::store_runtime as runtime;

fn connect(url: &str) -> Arc<dyn SessionPersistence> {
    Arc::new(block_on(PostgresStore::connect(url)).unwrap())
}

/// Takes the lease of `id` for a new holder once the current one has expired. The expiry is
/// the behavior under test and the server's clock decides it, so this polls (bounded) rather
/// than waits on an event: nothing announces a lease running out.
fn acquire_once_expired(store: &PostgresStore, id: SessionId) -> subagents::store::Lease {
    let mut taken = None;
    poll_until("the lease to expire", || {
        match block_on(store.acquire_lease(id, LeaseHolder::new())) {
            Ok(lease) => taken = Some(lease),
            Err(error) => assert_eq!(error.code(), ErrorCode::SessionLeased),
        }
        taken.is_some()
    });
    taken.expect("taken once the poll ended")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn the_postgres_store_acts_like_the_model_even_across_reconnects(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let runtime = runtime();
        let _entered = runtime.enter();
        // A database per case: the model lists every session of its store.
        let url = postgres_or_skip!(Ok(())).fresh_database();
        check_against_model(
            &ops,
            connect(&url),
            &|old| {
                drop(old);
                connect(&url)
            },
            &|| unreachable!("op() never crashes"),
        );
    }
}

#[test]
fn a_lease_expires_unless_renewed_and_its_late_writer_is_fenced_out() {
    // (Fencing, refusal, renewal and release are the shared suite's: tests/store.rs.)
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let mut config = PostgresConfig::new(url.clone());
    config.lease_ttl = Duration::from_millis(300);
    let store = block_on(PostgresStore::connect_with(config)).unwrap();
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let holder = LeaseHolder::new();
    let lease = block_on(store.acquire_lease(id, holder.clone())).unwrap();
    assert_eq!(
        lease.ttl,
        Some(Duration::from_millis(300)),
        "a networked lease must be renewed"
    );
    assert!(!lease.taken_over, "a free lease is no takeover");
    // Another process (a store that never saw this holder) is refused while the lease lives.
    let other_process = block_on(PostgresStore::connect(&url)).unwrap();
    let refused = block_on(other_process.acquire_lease(id, LeaseHolder::new())).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::SessionLeased, "still held");
    let taken = acquire_once_expired(&other_process, id);
    assert!(taken.epoch > lease.epoch);
    assert!(taken.taken_over, "an expired lease is taken over");
    let late = block_on(store.append(id, 0, notes(0, 1), Some(lease.epoch))).unwrap_err();
    assert_eq!(
        late.code(),
        ErrorCode::LeaseLost,
        "the expired holder is fenced out"
    );
    assert_eq!(
        block_on(store.renew_lease(id, lease.epoch))
            .unwrap_err()
            .code(),
        ErrorCode::LeaseLost
    );
    assert!(
        block_on(store.read_from(id, 0)).unwrap().is_empty(),
        "nothing of its landed"
    );
}

/// A fresh database's store (and its url), with the runtime entered by the caller.
fn fresh() -> Option<(PostgresStore, String)> {
    let url = postgres_or_skip!(None).fresh_database();
    Some((block_on(PostgresStore::connect(&url)).unwrap(), url))
}

/// Asserts that the store answered `calls` concurrent calls of one kind (`what`; `pick` reads
/// its counts from [`PostgresStore::batched_calls`]) since `before`, with at most one statement
/// (or transaction) for every `share` of them.
fn coalesced(
    store: &PostgresStore,
    before: BatchedCalls,
    pick: impl Fn(&BatchedCalls) -> (u64, u64),
    (what, calls, share): (&str, u64, u64),
) {
    let ((asked, answered), (asked_before, answered_before)) =
        (pick(&store.batched_calls()), pick(&before));
    let (asked, answered) = (asked - asked_before, answered - answered_before);
    assert_eq!(asked, calls, "{what} asked");
    assert!(
        answered * share <= asked,
        "{asked} concurrent {what} took {answered} statements"
    );
}

/// Runs one SQL statement on `url` (to damage rows as a bad writer or a newer crate would).
pub(crate) fn execute(url: &str, sql: &str) {
    block_on(async {
        let client = raw_client(url).await;
        client.batch_execute(sql).await.unwrap();
    });
}

#[test]
fn children_are_listed_by_parent_and_a_corrupt_header_is_its_own_error() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh() else {
        return;
    };
    let parent = SessionId::new();
    block_on(store.create(SessionHeader::new(parent), notes(0, 1))).unwrap();
    let mut children = Vec::new();
    for _ in 0..3 {
        let mut header = SessionHeader::new(SessionId::new());
        header.parent_session = Some(parent);
        children.push(header.id);
        block_on(store.create(header, notes(0, 1))).unwrap();
    }
    let listed: Vec<SessionId> = block_on(store.list_children(parent))
        .unwrap()
        .iter()
        .filter_map(ListedSession::id)
        .collect();
    children.sort();
    assert_eq!(listed, children, "by parent, in id order");
    assert!(block_on(store.list_children(children[0]))
        .unwrap()
        .is_empty());

    execute(
        &url,
        &format!(
            "UPDATE subagents_sessions SET header = 'not json'::bytea WHERE id = '{}'",
            children[1]
        ),
    );
    let listed = block_on(store.list_children(parent)).unwrap();
    assert_eq!(listed.len(), 3, "a bad row never hides the others");
    assert!(
        matches!(&listed[1], ListedSession::Corrupt { id: Some(id), .. } if *id == children[1])
    );
    assert_eq!(
        block_on(store.header(children[1])).unwrap_err().code(),
        ErrorCode::StoreCorrupt
    );
    assert!(block_on(store.header(children[0])).is_ok());
}

#[test]
fn compare_and_append_refuses_a_gap_a_duplicate_and_an_unknown_session() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), notes(0, 2))).unwrap();
    block_on(store.append(id, 2, notes(2, 3), None)).unwrap();
    for expected in [4, 6] {
        let refused = block_on(store.append(id, expected, notes(expected, 1), None)).unwrap_err();
        assert_eq!(
            refused.code(),
            ErrorCode::StoreConflict,
            "expected {expected}"
        );
    }
    assert_eq!(
        block_on(store.append(SessionId::new(), 0, notes(0, 1), None))
            .unwrap_err()
            .code(),
        ErrorCode::SessionNotFound
    );
    assert_eq!(
        block_on(store.create(SessionHeader::new(id), vec![]))
            .unwrap_err()
            .code(),
        ErrorCode::SessionExists
    );
    // A read from the middle of an append returns exactly the rest.
    let rest = block_on(store.read_from(id, 3)).unwrap();
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(block_on(store.read_from(id, 5)).unwrap().is_empty());
}

#[test]
fn two_writers_racing_for_one_seq_leave_exactly_one_append() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let store = Arc::new(store);
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            runtime.spawn(async move { store.append(id, 0, notes(0, 2), None).await })
        })
        .collect();
    let outcomes: Vec<_> = block_on(futures::future::join_all(racers))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(outcomes.iter().filter(|outcome| outcome.is_ok()).count(), 1);
    assert!(outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().err())
        .all(|error| error.code() == ErrorCode::StoreConflict));
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 2);
}

// A burst of cold resumes reads hundreds of logs and takes hundreds of leases at once; one
// statement each made every follow-up wait for the whole burst (acceptance p50 150-230 ms in
// the default load). Concurrent calls now share a statement, and each still gets its own answer.
#[test]
fn concurrent_reads_share_statements_and_each_gets_its_own_log() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let stored: Vec<(SessionId, Vec<Arc<SessionEvent>>)> = (0..64u64)
        .map(|index| {
            let id = SessionId::new();
            let events = notes(0, index % 5);
            block_on(store.create(SessionHeader::new(id), events.clone())).unwrap();
            (id, events)
        })
        .collect();
    let unknown = SessionId::new();
    let before = store.batched_calls();
    let (inspected, missing, headers) = block_on(async {
        futures::join!(
            futures::future::join_all(stored.iter().map(|(id, _)| store.inspect(*id))),
            store.inspect(unknown),
            futures::future::join_all(stored.iter().map(|(id, _)| store.header(*id))),
        )
    });
    for (((id, written), inspected), header) in stored.iter().zip(inspected).zip(headers) {
        let inspected = inspected.unwrap();
        assert_eq!(inspected.header.id, *id);
        assert_eq!(header.unwrap().id, *id);
        assert_eq!(&inspected.events, written, "session {id}");
    }
    assert_eq!(missing.unwrap_err().code(), ErrorCode::SessionNotFound);
    // An inspection reads its header and log together: 129 reads.
    let read = |calls: &BatchedCalls| (calls.reads, calls.read_statements);
    coalesced(&store, before, read, ("reads", 129, 8));
}

// Every epoch of every child appends as its turns end, and a statement per append cost the
// server a statement's overhead each (twice the runtime's own processor time in the default
// load, appends half of it). Concurrent appends now share a statement, and each is still
// checked alone: the ones that fit land, a stale seq conflicts, a fenced writer's lease is
// lost, an unknown session is not found, and none of them fails another.
#[test]
fn concurrent_appends_share_statements_and_each_is_decided_alone() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let created = || {
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), notes(0, 1))).unwrap();
        id
    };
    let distinct: Vec<SessionId> = (0..64).map(|_| created()).collect();
    let (stale, fenced, unknown) = (created(), created(), SessionId::new());
    let old = block_on(store.acquire_lease(fenced, LeaseHolder::new())).unwrap();
    block_on(store.release_lease(fenced, old.epoch)).unwrap();
    let newer = block_on(store.acquire_lease(fenced, LeaseHolder::new())).unwrap();
    let before = store.batched_calls();
    let (landed, conflict, lost, missing) = block_on(async {
        futures::join!(
            futures::future::join_all(distinct.iter().zip(1..).map(|(id, count)| store.append(
                *id,
                1,
                notes(1, count % 4 + 1),
                None
            ))),
            store.append(stale, 0, notes(0, 1), None),
            store.append(fenced, 1, notes(1, 1), Some(old.epoch)),
            store.append(unknown, 0, notes(0, 1), None),
        )
    });
    for ((id, landed), count) in distinct.iter().zip(landed).zip(1u64..) {
        landed.unwrap_or_else(|error| panic!("session {id}: {error}"));
        let stored = block_on(store.read_from(*id, 0)).unwrap();
        assert_eq!(
            stored.len(),
            usize::try_from(count % 4 + 2).unwrap(),
            "session {id}"
        );
    }
    assert_eq!(conflict.unwrap_err().code(), ErrorCode::StoreConflict);
    assert_eq!(lost.unwrap_err().code(), ErrorCode::LeaseLost);
    assert_eq!(missing.unwrap_err().code(), ErrorCode::SessionNotFound);
    assert_eq!(block_on(store.read_from(stale, 0)).unwrap().len(), 1);
    assert_eq!(block_on(store.read_from(fenced, 0)).unwrap().len(), 1);
    // The lease that fenced the stale writer still writes.
    block_on(store.append(fenced, 1, notes(1, 1), Some(newer.epoch))).unwrap();
    let append = |calls: &BatchedCalls| (calls.appends, calls.append_statements);
    coalesced(&store, before, append, ("appends", 68, 4));
}

// Projection-cache writes share statements the same way, each still fenced alone: a write
// under the session's lease lands, one under a lease taken since is refused, an unleased one
// lands whatever the lease.
#[test]
fn concurrent_cache_writes_share_statements_and_each_is_fenced_alone() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let leased: Vec<(SessionId, LeaseEpoch)> = (0..64)
        .map(|_| {
            let id = SessionId::new();
            block_on(store.create(SessionHeader::new(id), notes(0, 1))).unwrap();
            (
                id,
                block_on(store.acquire_lease(id, LeaseHolder::new()))
                    .unwrap()
                    .epoch,
            )
        })
        .collect();
    let (fenced, stale) = leased[0];
    block_on(store.release_lease(fenced, stale)).unwrap();
    block_on(store.acquire_lease(fenced, LeaseHolder::new())).unwrap();
    let row = |n: usize| serde_json::json!({ "n": n });
    let before = store.batched_calls();
    let (written, unleased) = block_on(async {
        futures::join!(
            futures::future::join_all(
                leased
                    .iter()
                    .enumerate()
                    .map(|(n, (id, epoch))| store.cache_put("unit", *id, row(n), Some(*epoch)))
            ),
            store.cache_put("other", fenced, row(1000), None),
        )
    });
    let mut written = written.into_iter();
    assert_eq!(
        written.next().unwrap().unwrap_err().code(),
        ErrorCode::LeaseLost
    );
    assert_eq!(block_on(store.cache_get("unit", fenced)).unwrap(), None);
    for ((n, (id, _)), written) in leased.iter().enumerate().skip(1).zip(written) {
        written.unwrap_or_else(|error| panic!("session {id}: {error}"));
        assert_eq!(
            block_on(store.cache_get("unit", *id)).unwrap(),
            Some(row(n))
        );
    }
    unleased.unwrap();
    assert_eq!(
        block_on(store.cache_get("other", fenced)).unwrap(),
        Some(row(1000))
    );
    let put = |calls: &BatchedCalls| (calls.cache_puts, calls.cache_put_statements);
    coalesced(&store, before, put, ("cache writes", 65, 4));
}

// Grants decided together are decided as if in turn: a session goes to its first asker and
// is refused to another live holder, a holder asking twice gets a newer epoch that fences the
// older, and an unknown session fails alone.
#[test]
fn concurrent_lease_grants_share_transactions_and_decide_as_if_in_turn() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let created = || empty_session(&store);
    let distinct: Vec<SessionId> = (0..32).map(|_| created()).collect();
    let (contested, repeated, unknown) = (created(), created(), SessionId::new());
    let (holder, rival) = (LeaseHolder::new(), LeaseHolder::new());
    let before = store.batched_calls();
    let (granted, contest, repeats, missing) = block_on(async {
        futures::join!(
            futures::future::join_all(
                distinct
                    .iter()
                    .map(|id| store.acquire_lease(*id, holder.clone()))
            ),
            futures::future::join(
                store.acquire_lease(contested, holder.clone()),
                store.acquire_lease(contested, rival.clone()),
            ),
            futures::future::join(
                store.acquire_lease(repeated, holder.clone()),
                store.acquire_lease(repeated, holder.clone()),
            ),
            store.acquire_lease(unknown, holder.clone()),
        )
    });
    for lease in granted {
        assert_eq!(lease.unwrap().epoch.0, 1);
    }
    let (first, second) = contest;
    assert!(first.is_ok() != second.is_ok(), "{first:?} {second:?}");
    let refused = first.err().or(second.err()).unwrap();
    assert_eq!(refused.code(), ErrorCode::SessionLeased);
    let (older, newer) = (repeats.0.unwrap(), repeats.1.unwrap());
    let (older, newer) = if older.epoch < newer.epoch {
        (older, newer)
    } else {
        (newer, older)
    };
    assert_eq!(newer.epoch.0, older.epoch.0 + 1);
    let fenced = block_on(store.append(repeated, 0, notes(0, 1), Some(older.epoch))).unwrap_err();
    assert_eq!(fenced.code(), ErrorCode::LeaseLost);
    block_on(store.append(repeated, 0, notes(0, 1), Some(newer.epoch))).unwrap();
    assert_eq!(missing.unwrap_err().code(), ErrorCode::SessionNotFound);
    let grant = |calls: &BatchedCalls| (calls.leases, calls.lease_transactions);
    coalesced(&store, before, grant, ("grants", 37, 4));
}

// Every epoch's end and every one-shot child's disposal releases a lease: a burst of them took a
// statement each. Releases asked together now share one, and each still releases only its own
// epoch: a lease taken again since, under a newer epoch, stays held.
#[test]
fn concurrent_lease_releases_share_statements_and_release_only_their_epoch() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let holder = LeaseHolder::new();
    let sessions: Vec<SessionId> = (0..32).map(|_| SessionId::new()).collect();
    let leases: Vec<_> = sessions
        .iter()
        .map(|id| {
            block_on(store.create(SessionHeader::new(*id), notes(0, 1))).unwrap();
            block_on(store.acquire_lease(*id, holder.clone())).unwrap()
        })
        .collect();
    // The first session's lease is taken again: its first epoch no longer holds it.
    let kept = block_on(store.acquire_lease(sessions[0], holder.clone())).unwrap();
    assert!(kept.epoch > leases[0].epoch);
    let before = store.batched_calls();
    let released = block_on(futures::future::join_all(
        sessions
            .iter()
            .zip(&leases)
            .map(|(id, lease)| store.release_lease(*id, lease.epoch)),
    ));
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    let release = |calls: &BatchedCalls| (calls.releases, calls.release_statements);
    coalesced(&store, before, release, ("releases", 32, 8));
    // Released: another holder takes them at once. Kept: its newer lease still holds it.
    let rival = LeaseHolder::new();
    for id in &sessions[1..] {
        block_on(store.acquire_lease(*id, rival.clone())).unwrap();
    }
    let refused = block_on(store.acquire_lease(sessions[0], rival)).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::SessionLeased);
    block_on(store.append(sessions[0], 1, notes(1, 1), Some(kept.epoch))).unwrap();
}

// Creations asked together are decided as if in turn: each session is created once with its
// seed and its first lease, the other asker of the same id finds it there (`SESSION_EXISTS`),
// as does an asker of a session stored before, and the burst takes a few statements.
#[test]
fn concurrent_creations_share_statements_and_decide_as_if_in_turn() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let stored = SessionId::new();
    block_on(store.create(SessionHeader::new(stored), vec![])).unwrap();
    let seeded: Vec<SessionId> = (0..32).map(|_| SessionId::new()).collect();
    let leased: Vec<SessionId> = (0..32).map(|_| SessionId::new()).collect();
    let twice = SessionId::new();
    let holder = LeaseHolder::new();
    let before = store.batched_calls();
    let (seeds, leases, (first, second), again) = block_on(async {
        futures::join!(
            futures::future::join_all(
                seeded
                    .iter()
                    .map(|id| store.create(SessionHeader::new(*id), notes(0, 3)))
            ),
            futures::future::join_all(leased.iter().map(|id| {
                store.create_leased(SessionHeader::new(*id), vec![], holder.clone())
            })),
            futures::future::join(
                store.create(SessionHeader::new(twice), notes(0, 1)),
                store.create(SessionHeader::new(twice), notes(0, 2)),
            ),
            store.create(SessionHeader::new(stored), notes(0, 1)),
        )
    });
    for created in seeds {
        created.unwrap();
    }
    for id in &seeded {
        assert_eq!(block_on(store.read_from(*id, 0)).unwrap().len(), 3);
    }
    for (id, lease) in leased.iter().zip(leases) {
        assert_eq!(lease.unwrap().epoch.0, 1);
        let refused = block_on(store.acquire_lease(*id, LeaseHolder::new())).unwrap_err();
        assert_eq!(
            refused.code(),
            ErrorCode::SessionLeased,
            "held by its creator"
        );
    }
    // Two batches may run at once: either asker may be the first to reach the server.
    assert!(first.is_ok() != second.is_ok(), "{first:?} {second:?}");
    let winner_seed = if first.is_ok() { 1 } else { 2 };
    let refused = first.err().or(second.err()).unwrap();
    assert_eq!(refused.code(), ErrorCode::SessionExists);
    assert_eq!(
        block_on(store.read_from(twice, 0)).unwrap().len(),
        winner_seed,
        "the creator's seed, whole"
    );
    assert_eq!(again.unwrap_err().code(), ErrorCode::SessionExists);
    assert!(block_on(store.read_from(stored, 0)).unwrap().is_empty());
    let create = |calls: &BatchedCalls| (calls.creations, calls.creation_statements);
    coalesced(&store, before, create, ("creations", 67, 4));
}

/// A proxy in front of `url`'s server (a unix socket) that loses one answer: once a client
/// sends `marker` (the bytes of a parameter of the statement to hit), what the server sends
/// back on that connection is held until its `ReadyForQuery` (the statement's transaction has
/// committed by then), and the connection is closed instead of answered. Every other
/// connection, and every later one, passes through. Answers the proxied connection string.
fn losing_one_answer(url: &str, marker: Vec<u8>) -> (String, tempfile::TempDir) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let field = |name: &str| {
        url.split_whitespace()
            .find_map(|part| part.strip_prefix(&format!("{name}=")))
            .unwrap()
            .to_owned()
    };
    let (host, port) = (field("host"), field("port"));
    let server = std::path::PathBuf::from(host).join(format!(".s.PGSQL.{port}"));
    let dir = tempfile::tempdir().unwrap();
    let listener =
        tokio::net::UnixListener::bind(dir.path().join(format!(".s.PGSQL.{port}"))).unwrap();
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = tokio::net::UnixStream::connect(&server).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = upstream.into_split();
            let armed = Arc::new(tokio::sync::Notify::new());
            let (marker, lost, arming) = (marker.clone(), Arc::clone(&lost), Arc::clone(&armed));
            tokio::spawn(async move {
                let mut buffer = vec![0; 64 * 1024];
                while let Ok(read) = client_read.read(&mut buffer).await {
                    if read == 0 {
                        break;
                    }
                    let sent = &buffer[..read];
                    if sent.windows(marker.len()).any(|window| window == marker)
                        && !lost.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        arming.notify_one();
                    }
                    if server_write.write_all(sent).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(async move {
                // Message by message: a tag, a length that counts itself, the body.
                let mut armed_now = std::pin::pin!(armed.notified());
                let mut holding = false;
                loop {
                    let mut head = [0u8; 5];
                    tokio::select! {
                        biased;
                        () = &mut armed_now, if !holding => {
                            holding = true;
                            continue;
                        }
                        read = server_read.read_exact(&mut head) => {
                            if read.is_err() {
                                break;
                            }
                        }
                    }
                    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
                    let mut body = vec![0; length as usize - 4];
                    if server_read.read_exact(&mut body).await.is_err() {
                        break;
                    }
                    if holding {
                        if head[0] == b'Z' {
                            // Committed, and never answered: the client sees the connection end.
                            break;
                        }
                        continue;
                    }
                    if client_write.write_all(&head).await.is_err()
                        || client_write.write_all(&body).await.is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    let proxied = url.replace(
        &format!("host={}", field("host")),
        &format!("host={}", dir.path().display()),
    );
    (proxied, dir)
}

// A creation whose transaction committed but whose answer was lost with its connection is
// tried again on a fresh one, finds its own session stored (the same header), and answers
// that it created it: once, with nothing created twice and no `SESSION_EXISTS` for its own.
#[test]
fn a_creation_whose_answer_was_lost_after_its_commit_is_answered_created() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    // The schema first, straight to the server: the proxy hits only the creation.
    drop(block_on(PostgresStore::connect(&url)).unwrap());
    let id = SessionId::new();
    let (proxied, _dir) = losing_one_answer(&url, id.as_uuid().as_bytes().to_vec());
    let store = block_on(PostgresStore::connect(&proxied)).unwrap();
    block_on(within(
        "the creation",
        store.create(SessionHeader::new(id), notes(0, 2)),
    ))
    .expect("its own creation, settled after the lost answer");
    let sessions: i64 = query_value(&url, "SELECT count(*) FROM subagents_sessions");
    assert_eq!(sessions, 1);
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 2);
    let calls = store.batched_calls();
    assert_eq!(calls.creations, 1);
    assert_eq!(
        calls.creation_statements, 1,
        "one batch, tried twice inside it"
    );
}

// A batch of events past the size the server compresses at (about 2 KB) is compressed with
// lz4 where the server has it (a quarter of the default pglz's cost to write), and reads back
// whole.
#[test]
fn stored_batches_are_compressed_with_lz4_where_the_server_has_it() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh() else {
        return;
    };
    let has_lz4 = block_on(async {
        let client = raw_client(&url).await;
        client
            .batch_execute("SET default_toast_compression = lz4")
            .await
            .is_ok()
    });
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), notes(0, 100))).unwrap();
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 100);
    let method: String = query_value(
        &url,
        "SELECT coalesce(pg_column_compression(events), 'none') FROM subagents_event_batches",
    );
    assert_eq!(method, if has_lz4 { "lz4" } else { "pglz" });
}

#[test]
fn the_projection_cache_keeps_one_row_per_unit_and_session() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), notes(0, 1))).unwrap();
    assert_eq!(block_on(store.cache_get("identity", id)).unwrap(), None);
    let row = serde_json::json!({"label": "child", "seq": 1});
    block_on(store.cache_put("identity", id, serde_json::json!({"old": true}), None)).unwrap();
    block_on(store.cache_put("identity", id, row.clone(), None)).unwrap();
    assert_eq!(
        block_on(store.cache_get("identity", id)).unwrap(),
        Some(row)
    );
    assert_eq!(block_on(store.cache_get("timing", id)).unwrap(), None);
}

/// Signals `pid` (the paused-writer drill).
fn signal(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

#[test]
fn a_paused_writer_that_wakes_past_its_lease_is_fenced_out_and_faults() {
    use std::io::BufRead;
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    // A writer in another process, flushing every step, turn after turn.
    let mut writer = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args([
            "demo",
            "--burst",
            "100000",
            "--lease-ttl-ms",
            "600",
            "--store",
            &url,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(writer.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let id: SessionId = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    signal(writer.id(), rustix::process::Signal::STOP);
    // The rest of its output is drained, so a full pipe never holds it.
    let drained = std::thread::spawn(move || lines.count());

    // The new owner takes the lease once it has expired, and writes under its own epoch.
    let store = block_on(PostgresStore::connect(&url)).unwrap();
    let lease = acquire_once_expired(&store, id);
    let before = block_on(store.read_from(id, 0)).unwrap().len() as u64;
    block_on(store.append(id, before, notes(before, 1), Some(lease.epoch))).unwrap();

    signal(writer.id(), rustix::process::Signal::CONT);
    let status = writer.wait().unwrap();
    drained.join().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut writer.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "the fenced writer faults: {stderr}");
    assert!(
        stderr.contains("LEASE_LOST") || stderr.contains("no longer current"),
        "{stderr}"
    );
    let after = block_on(store.read_from(id, 0)).unwrap();
    assert_eq!(
        after.len() as u64,
        before + 1,
        "nothing of the old writer's after the new owner's epoch"
    );
}

#[test]
fn the_store_refuses_to_run_outside_a_runtime() {
    let url = postgres_or_skip!().fresh_database();
    let refused = block_on(PostgresStore::connect(&url)).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::NoActorSystem);
}

// A connection the pool opened for another thread (an agent's worker arbiter) keeps serving the
// store while that thread cannot drive it (here, blocked; in a load run, stopped before the
// verification): the pool opens its connections on the store's own runtime.
#[actix_rt::test]
async fn connections_opened_for_a_worker_serve_the_store_while_the_worker_is_stuck() {
    let store = Arc::new(
        PostgresStore::connect(&postgres_or_skip!().fresh_database())
            .await
            .unwrap(),
    );
    let ids: Vec<SessionId> = (0..4).map(|_| SessionId::new()).collect();
    let worker = actix::Arbiter::new();
    let (created_tx, created) = tokio::sync::oneshot::channel();
    let on_worker = Arc::clone(&store);
    let to_create = ids.clone();
    // At once, so the pool opens connections for the worker.
    assert!(worker.spawn(async move {
        let creations = to_create
            .into_iter()
            .map(|id| on_worker.create(SessionHeader::new(id), vec![]));
        let _ = created_tx.send(futures::future::join_all(creations).await);
    }));
    for creation in created.await.unwrap() {
        creation.unwrap();
    }
    // The worker's thread is held until the reads are done: nothing on it runs.
    let (release, held) = std::sync::mpsc::channel::<()>();
    assert!(worker.spawn(async move {
        let _ = held.recv();
    }));
    let reads = within(
        "reads through every pooled connection",
        futures::future::join_all(ids.iter().map(|id| store.read_from(*id, 0))),
    )
    .await;
    release.send(()).unwrap();
    worker.stop();
    worker.join().unwrap();
    for read in reads {
        assert!(read.unwrap().is_empty());
    }
}

/// Polls `done` every 20 ms until it holds, failing the test after 20 s. For what
/// only the server's clock or its processes decide (an expiry, a pruning, a reconnection):
/// nothing announces those, so there is no event to wait on.
pub(crate) fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One value of one row of `sql` on `url` (to read what the store wrote, as an operator would).
pub(crate) fn query_value<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    url: &str,
    sql: &str,
) -> T {
    block_on(async {
        let client = raw_client(url).await;
        client.query_one(sql, &[]).await.unwrap().get(0)
    })
}

/// A store whose nodes go silent after 600 ms and whose plain leases after 300 ms.
pub(crate) fn cluster_store(url: &str) -> Arc<PostgresStore> {
    let mut config = PostgresConfig::new(url);
    config.node_ttl = Duration::from_millis(600);
    config.lease_ttl = Duration::from_millis(300);
    Arc::new(block_on(PostgresStore::connect_with(config)).unwrap())
}

// A node's leases need no renewal: they live while the node heartbeats, past both time-to-lives.
// Once the node goes silent (its process died: here its membership is dropped without leaving),
// another node takes them within the node time-to-live, and the silent node's late write is
// refused by its fencing epoch with nothing landed.
#[test]
fn a_nodes_lease_lives_while_it_heartbeats_and_passes_on_once_it_goes_silent() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let store = cluster_store(&url);
    let node = LeaseHolder::new();
    let membership = block_on(store.join(&node, "a")).unwrap();
    assert_eq!(membership.node(), node.id());
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let lease = block_on(store.acquire_lease(id, node.clone())).unwrap();
    assert_eq!(
        lease.ttl, None,
        "a node's lease is not renewed lease by lease"
    );
    let other = block_on(PostgresStore::connect(&url)).unwrap();
    // Past the lease and node time-to-lives, with no renewal: only the heartbeat keeps it. (A
    // wait is the behavior under test: nothing announces that a lease is still held.)
    std::thread::sleep(Duration::from_millis(1_500));
    let refused = block_on(other.acquire_lease(id, LeaseHolder::new())).unwrap_err();
    assert_eq!(
        refused.code(),
        ErrorCode::SessionLeased,
        "held by a live node"
    );
    block_on(store.append(id, 0, notes(0, 1), Some(lease.epoch))).unwrap();

    drop(membership);
    let taken = acquire_once_expired(&other, id);
    assert!(taken.epoch > lease.epoch);
    let late = block_on(store.append(id, 1, notes(1, 1), Some(lease.epoch))).unwrap_err();
    assert_eq!(
        late.code(),
        ErrorCode::LeaseLost,
        "the silent node is fenced out"
    );
    assert_eq!(
        block_on(store.read_from(id, 0)).unwrap().len(),
        1,
        "nothing of the silent node's landed after the new owner's epoch"
    );
}

// A node paused past its time-to-live wakes before it learns that it was declared dead, and
// before any other node took its sessions: its leases are no longer live, so its writes are
// refused (the parent's node has already told the parent that the epoch ended with its node; a
// turn that started after that would go unannounced). The same holds for a plain lease that
// expired unrenewed: a write needs a live lease, not only the latest epoch.
#[test]
fn a_write_under_a_lease_that_is_no_longer_live_is_refused_before_anyone_takes_it() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let store = cluster_store(&url);
    let node = LeaseHolder::new();
    let membership = block_on(store.join(&node, "paused")).unwrap();
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let lease = block_on(store.acquire_lease(id, node)).unwrap();
    block_on(store.append(id, 0, notes(0, 1), Some(lease.epoch))).unwrap();
    execute(
        &url,
        "UPDATE subagents_nodes SET expires_at = now() - interval '1 second'",
    );
    let late = block_on(store.append(id, 1, notes(1, 1), Some(lease.epoch))).unwrap_err();
    assert_eq!(late.code(), ErrorCode::LeaseLost, "{late}");
    drop(membership);

    let plain = SessionId::new();
    block_on(store.create(SessionHeader::new(plain), vec![])).unwrap();
    let lease = block_on(store.acquire_lease(plain, LeaseHolder::new())).unwrap();
    execute(
        &url,
        "UPDATE subagents_leases SET expires_at = now() - interval '1 second'",
    );
    let late = block_on(store.append(plain, 0, notes(0, 1), Some(lease.epoch))).unwrap_err();
    assert_eq!(late.code(), ErrorCode::LeaseLost, "{late}");
    for session in [id, plain] {
        assert_eq!(
            block_on(store.read_from(session, 0)).unwrap().len(),
            usize::from(session == id),
            "nothing written after the lease stopped being live landed"
        );
    }
}

// A runtime run as a node leases every session it drives in the node's name.
#[actix_rt::test]
async fn a_runtime_run_as_a_node_leases_in_the_nodes_name() {
    let url = postgres_or_skip!().fresh_database();
    let mut config = PostgresConfig::new(url.clone());
    config.node_ttl = Duration::from_millis(600);
    let store = Arc::new(PostgresStore::connect_with(config).await.unwrap());
    let node = LeaseHolder::new();
    let membership = store.join(&node, "runtime").await.unwrap();
    let rt = subagents::Runtime::builder()
        .shared_store(store.clone())
        .lease_holder(node.clone())
        .model(
            "scripted",
            subagents::testing::ScriptedModel::repeating(subagents::testing::ScriptStep::text(
                "done",
            )),
        )
        .build()
        .unwrap();
    let agent = rt
        .agents()
        .create(subagents::CreateAgent::new())
        .await
        .unwrap();
    let holder: uuid::Uuid = {
        let url = url.clone();
        let id = agent.agent().id();
        tokio::task::spawn_blocking(move || {
            query_value(
                &url,
                &format!("SELECT holder FROM subagents_leases WHERE session = '{id}'"),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(holder, node.id());
    agent.dispose().await.unwrap();
    rt.shutdown().await.unwrap();
    membership.leave().await.unwrap();
}

/// Two nodes on `url`, each with a store (and connections) of its own, as two processes have.
fn two_nodes(
    url: &str,
) -> (
    subagents::store::NodeMembership,
    subagents::store::NodeMembership,
) {
    let join = |name| block_on(cluster_store(url).join(&LeaseHolder::new(), name)).unwrap();
    (join("a"), join("b"))
}

/// A handler that records what it serves and answers `{"seen": n}`, refusing `n == 7`; the
/// first delivery it serves waits for `gate`.
fn recording_handler(
    served: &Arc<std::sync::Mutex<Vec<(i64, u64)>>>,
    gate: &subagents::testing::Gate,
) -> subagents::store::deliveries::DeliveryHandler {
    let served = Arc::clone(served);
    let gate = gate.clone();
    Arc::new(move |delivery: subagents::store::deliveries::Delivery| {
        let n = delivery.payload["n"].as_u64().unwrap();
        served.lock().unwrap().push((delivery.id, n));
        let gate = gate.clone();
        Box::pin(async move {
            if n == 0 {
                gate.pass().await;
            }
            if n == 7 {
                Err(subagents::SubagentError::new(
                    ErrorCode::Unauthorized,
                    "not from this sender",
                ))
            } else {
                Ok(serde_json::json!({ "seen": n }))
            }
        })
    })
}

// Deliveries between two nodes (each with its own connections, as two processes would have),
// committed one after another while the target is busy with the first: every one is served
// exactly once, in the order it was sent, and its sender gets its own answer, or the target's
// typed error.
#[test]
fn deliveries_between_nodes_are_served_once_each_in_the_order_sent() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, target) = two_nodes(&url);
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate = subagents::testing::Gate::new();
    target
        .serve(recording_handler(&served, &gate))
        .expect("the target serves");
    let session = SessionId::new();
    let sent: Vec<_> = (0..30u64)
        .map(|n| {
            block_on(sender.send(target.node(), session, &serde_json::json!({ "n": n }))).unwrap()
        })
        .collect();
    gate.release();
    for (n, sent) in sent.into_iter().enumerate() {
        let answer = block_on(within("an answer", sent.answer()));
        if n == 7 {
            let refused = answer.unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Unauthorized);
            assert_eq!(refused.message(), "not from this sender");
        } else {
            assert_eq!(answer.unwrap(), serde_json::json!({ "seen": n }));
        }
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<u64> = served.iter().map(|(_, n)| *n).collect();
    assert_eq!(
        order,
        (0..30).collect::<Vec<_>>(),
        "each served once, in the order sent"
    );
    let answered: i64 = query_value(
        &url,
        "SELECT count(*) FROM subagents_deliveries WHERE state = 'answered'",
    );
    assert_eq!(answered, 30);
}

// Deliveries about different sessions are served at once: one whose handler holds does not
// keep another session's from being answered, while a later one about the held session waits
// its turn behind it.
#[test]
fn deliveries_about_different_sessions_are_served_at_once() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, target) = two_nodes(&url);
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let gate = subagents::testing::Gate::new();
    target
        .serve(recording_handler(&served, &gate))
        .expect("the target serves");
    let (held, free) = (SessionId::new(), SessionId::new());
    let send = |session, n: u64| {
        block_on(sender.send(target.node(), session, &serde_json::json!({ "n": n }))).unwrap()
    };
    // n == 0 holds at the gate; n == 1 is about the same session, n == 2 about another.
    let first = send(held, 0);
    block_on(within("the held delivery", gate.reached()));
    let behind = send(held, 1);
    let other = send(free, 2);
    assert_eq!(
        block_on(within("the other session's answer", other.answer())).unwrap(),
        serde_json::json!({ "seen": 2 })
    );
    let order: Vec<u64> = served.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(order, [0, 2], "the held session's next one waits behind it");
    gate.release();
    assert_eq!(
        block_on(within("the held answer", first.answer())).unwrap(),
        serde_json::json!({ "seen": 0 })
    );
    assert_eq!(
        block_on(within("the answer behind it", behind.answer())).unwrap(),
        serde_json::json!({ "seen": 1 })
    );
}

// A delivery whose stored payload is malformed is answered `STORE_CORRUPT` when it is claimed,
// and the rest of the batch it was claimed in is still served.
#[test]
fn a_malformed_delivery_is_answered_store_corrupt_and_its_batch_still_served() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, target) = two_nodes(&url);
    let sent: Vec<_> = (1..=3u64)
        .map(|n| {
            block_on(sender.send(
                target.node(),
                SessionId::new(),
                &serde_json::json!({ "n": n }),
            ))
            .unwrap()
        })
        .collect();
    let corrupted: i64 = query_value(
        &url,
        "WITH corrupted AS (
             UPDATE subagents_deliveries SET payload = '\\x7b'::bytea
             WHERE id = (SELECT min(id) FROM subagents_deliveries) RETURNING 1
         ) SELECT count(*) FROM corrupted",
    );
    assert_eq!(corrupted, 1);
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    target
        .serve(recording_handler(&served, &subagents::testing::Gate::new()))
        .expect("the target serves");
    let mut answers = sent
        .into_iter()
        .map(|sent| block_on(within("an answer", sent.answer())));
    let malformed = answers.next().unwrap().unwrap_err();
    assert_eq!(malformed.code(), ErrorCode::StoreCorrupt);
    for (n, answer) in (2..=3u64).zip(answers) {
        assert_eq!(answer.unwrap(), serde_json::json!({ "seen": n }));
    }
    let order: Vec<u64> = served.lock().unwrap().iter().map(|(_, n)| *n).collect();
    assert_eq!(order, [2, 3], "only the well-formed ones reach the handler");
}

/// A node named `name` on its own store, whose server prunes every 200 ms (the delivery
/// retention sets the pruning period).
fn pruning_node(url: &str, name: &str) -> subagents::store::NodeMembership {
    let mut config = PostgresConfig::new(url);
    config.delivery_retention = Duration::from_millis(200);
    let store = Arc::new(block_on(PostgresStore::connect_with(config)).unwrap());
    block_on(store.join(&LeaseHolder::new(), name)).unwrap()
}

// Old deliveries are pruned by any serving node: an answered one once the retention has
// passed (its sender read it long before), and one left unserved to a node that is gone.
#[test]
fn old_deliveries_are_pruned_once_their_retention_passed() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let join = |name| pruning_node(&url, name);
    let (sender, target, gone) = (join("a"), join("b"), join("gone"));
    let gone_node = gone.node();
    block_on(gone.leave()).unwrap();
    target
        .serve(Arc::new(|_| {
            Box::pin(async { Ok(serde_json::json!("ok")) })
        }))
        .unwrap();
    let answer = block_on(sender.deliver(target.node(), SessionId::new(), &serde_json::json!(1)));
    assert_eq!(answer.unwrap(), serde_json::json!("ok"));
    // Sent to a node that left, and not waited for.
    drop(block_on(sender.send(gone_node, SessionId::new(), &serde_json::json!(2))).unwrap());
    let count = || -> i64 { query_value(&url, "SELECT count(*) FROM subagents_deliveries") };
    assert_eq!(count(), 2);
    // The retention is the behavior under test, and nothing announces a pruning: poll, bounded.
    poll_until("the deliveries to be pruned", || count() == 0);
}

// A delivery to a node that went silent before serving it is withdrawn once the node's
// membership expires, and its sender is told the session's node stopped.
#[test]
fn a_delivery_to_a_silent_node_is_withdrawn_and_its_sender_told() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, silent) = two_nodes(&url);
    let node = silent.node();
    drop(silent);
    let refused = block_on(within(
        "the refusal",
        sender.deliver(node, SessionId::new(), &serde_json::json!({ "n": 1 })),
    ))
    .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::SessionLeased);
    let state: String = query_value(&url, "SELECT state FROM subagents_deliveries");
    assert_eq!(state, "withdrawn", "a node that wakes cannot serve it");
}

// An answer too long to ride in its announcement (PostgreSQL caps a notification at 8,000
// bytes) is read back from its row.
#[test]
fn an_answer_too_long_for_its_announcement_is_read_from_its_row() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, target) = two_nodes(&url);
    target
        .serve(Arc::new(
            |delivery: subagents::store::deliveries::Delivery| {
                Box::pin(async move { Ok(delivery.payload) })
            },
        ))
        .expect("the target serves");
    for len in [10, 20_000] {
        let payload = serde_json::json!({ "text": "x".repeat(len) });
        let answer = block_on(within(
            "the echo",
            sender.deliver(target.node(), SessionId::new(), &payload),
        ))
        .unwrap();
        assert_eq!(answer, payload);
    }
}

// Every epoch's end flushes its child's log, and a flush is a synchronous commit (a write-ahead
// log fsync on the server): a burst of epochs ending at once ran one commit each. Concurrent
// flushes now share one, as on sled: the one in flight, then one for everyone who asked
// meanwhile.
#[test]
fn concurrent_flushes_share_synchronous_commits() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _)) = fresh() else {
        return;
    };
    let before = store.batched_calls();
    let flushed = block_on(futures::future::join_all(
        (0..20).map(|_| store.flush(SessionId::new())),
    ));
    assert!(flushed.iter().all(Result::is_ok), "{flushed:?}");
    let after = store.batched_calls();
    assert_eq!(after.flushes - before.flushes, 20);
    let commits = after.flush_commits - before.flush_commits;
    assert!(
        (1..=2).contains(&commits),
        "20 concurrent flushes ran {commits} synchronous commits"
    );
}

// A long run flushes session after session: the flush table keeps one row per connection
// slot, not a row per session forever.
#[test]
fn a_long_run_of_flushes_keeps_their_table_small() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh() else {
        return;
    };
    for _ in 0..300 {
        block_on(store.flush(SessionId::new())).unwrap();
    }
    let rows: i64 = query_value(&url, "SELECT count(*) FROM subagents_flushes");
    assert!(
        (1..=16).contains(&rows),
        "{rows} rows: at most one per pooled connection"
    );
}

// A long-lived process leases under holder after holder (a runtime each): a gone holder no
// lease row names is forgotten, so the remembered ones stay few, while a gone holder whose
// lease is still stored is remembered, and its session passes on at once.
#[test]
fn a_long_run_of_holders_keeps_the_remembered_ones_few() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, _url)) = fresh() else {
        return;
    };
    let abandoned = SessionId::new();
    block_on(store.create(SessionHeader::new(abandoned), vec![])).unwrap();
    let dropped = LeaseHolder::new();
    block_on(store.acquire_lease(abandoned, dropped.clone())).unwrap();
    drop(dropped);
    for _ in 0..500 {
        let holder = LeaseHolder::new();
        let id = SessionId::new();
        block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
        let lease = block_on(store.acquire_lease(id, holder)).unwrap();
        block_on(store.release_lease(id, lease.epoch)).unwrap();
    }
    let remembered = store.remembered_holders();
    assert!(remembered <= 64, "{remembered} holders remembered");
    let taken = block_on(store.acquire_lease(abandoned, LeaseHolder::new()));
    assert!(
        taken.is_ok(),
        "the dropped holder's lease is still known to hold nothing: {taken:?}"
    );
}

// A dead node's row is the record that keeps its holder from joining again; a serving node
// prunes it once it is older than the retention (one hour by default), and keeps a recent one.
#[test]
fn a_dead_nodes_row_is_pruned_once_its_retention_passed() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let join = |name| pruning_node(&url, name);
    let (serving, long_dead, recently_dead) = (join("serving"), join("long"), join("recent"));
    let (long_dead, recently_dead) = {
        let nodes = (long_dead.node(), recently_dead.node());
        // Silent, as a process that died: the rows stay, then expire.
        drop(long_dead);
        drop(recently_dead);
        nodes
    };
    execute(
        &url,
        &format!(
            "UPDATE subagents_nodes SET expires_at = now() - interval '2 hours'
             WHERE node = '{long_dead}';
             UPDATE subagents_nodes SET expires_at = now() - interval '1 second'
             WHERE node = '{recently_dead}'"
        ),
    );
    serving
        .serve(Arc::new(|_| {
            Box::pin(async { Ok(serde_json::json!("ok")) })
        }))
        .unwrap();
    let rows = |node: uuid::Uuid| -> i64 {
        query_value(
            &url,
            &format!("SELECT count(*) FROM subagents_nodes WHERE node = '{node}'"),
        )
    };
    // The retention is the behavior under test, and nothing announces a pruning: poll, bounded.
    poll_until("the dead node's row to be pruned", || rows(long_dead) == 0);
    assert_eq!(rows(recently_dead), 1, "a recent record is kept");
    assert_eq!(rows(serving.node()), 1, "a live node is kept");
}

// The listener's connection is a passing fault: terminated by the server (a restart, an
// operator's pg_terminate_backend), it is opened again and listens on the node's channel, and
// deliveries are served.
#[test]
fn a_lost_listener_connection_is_opened_again() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let (sender, target) = two_nodes(&url);
    target
        .serve(Arc::new(
            |delivery: subagents::store::deliveries::Delivery| {
                Box::pin(async move { Ok(delivery.payload) })
            },
        ))
        .unwrap();
    let listening = format!(
        "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE query = 'LISTEN subagents_node_{}'",
        target.node().simple()
    );
    let first: i32 = query_value(&url, &listening);
    assert_ne!(first, 0, "the node listens");
    execute(&url, &format!("SELECT pg_terminate_backend({first})"));
    // Reconnecting is the behavior under test, and nothing announces it: poll, bounded.
    poll_until("the listener to listen again", || {
        let now: i32 = query_value(&url, &listening);
        now != 0 && now != first
    });
    let answer = block_on(within(
        "the answer",
        sender.deliver(
            target.node(),
            SessionId::new(),
            &serde_json::json!({ "n": 1 }),
        ),
    ));
    assert_eq!(answer.unwrap(), serde_json::json!({ "n": 1 }));
}

// No cross-node ask waits without bound: a delivery its live target never takes is withdrawn
// at the deadline (it will not be served), and one it took and never answered is reported as
// possibly served; either way the sender hears NODE_UNRESPONSIVE.
#[test]
fn an_unanswered_delivery_ends_at_its_deadline() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let join = |name| {
        let mut config = PostgresConfig::new(url.clone());
        config.delivery_deadline = Duration::from_millis(300);
        let store = Arc::new(block_on(PostgresStore::connect_with(config)).unwrap());
        block_on(store.join(&LeaseHolder::new(), name)).unwrap()
    };
    let (sender, idle, stuck) = (join("sender"), join("idle"), join("stuck"));
    let state = |node: uuid::Uuid| -> String {
        query_value(
            &url,
            &format!("SELECT state FROM subagents_deliveries WHERE target = '{node}'"),
        )
    };
    // A live node that serves nothing never takes it.
    let untaken = block_on(within(
        "the deadline",
        sender.deliver(idle.node(), SessionId::new(), &serde_json::json!(1)),
    ))
    .unwrap_err();
    assert_eq!(untaken.code(), ErrorCode::NodeUnresponsive, "{untaken}");
    assert!(untaken.message().contains("withdrawn"), "{untaken}");
    assert_eq!(state(idle.node()), "withdrawn");
    // A node whose handler never answers took it.
    stuck
        .serve(Arc::new(|_| Box::pin(futures::future::pending())))
        .unwrap();
    let unanswered = block_on(within(
        "the deadline",
        sender.deliver(stuck.node(), SessionId::new(), &serde_json::json!(2)),
    ))
    .unwrap_err();
    assert_eq!(
        unanswered.code(),
        ErrorCode::NodeUnresponsive,
        "{unanswered}"
    );
    assert!(
        unanswered.message().contains("may have been served"),
        "{unanswered}"
    );
    assert_eq!(state(stuck.node()), "claimed");
}

/// Terminates every other connection to `url`'s database.
fn terminate_backends(url: &str) {
    execute(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
}

// PostgreSQL down for less than a node time-to-live loses no membership: a heartbeat that
// failed is tried again within the period, and lands once the server is back. Before, the
// next beat came a whole period later (a third of the time-to-live), so a server down across
// two beats, for less than the time-to-live, cost the node its membership (the campaign's
// seed 4013, a `pg_ctl restart` under a 3 s time-to-live).
#[test]
fn a_server_down_for_less_than_a_node_time_to_live_loses_no_membership() {
    const TTL: Duration = Duration::from_millis(7500);
    let runtime = runtime();
    let _entered = runtime.enter();
    let server = match crate::support::postgres::TestPostgres::private() {
        Some(server) => server,
        None => return,
    };
    let url = server.fresh_database();
    let mut config = PostgresConfig::new(url.clone());
    config.node_ttl = TTL;
    let store = Arc::new(block_on(PostgresStore::connect_with(config)).unwrap());
    let membership = block_on(store.join(&LeaseHolder::new(), "node")).unwrap();
    let lost = membership.lost();
    // Down right after a beat, past the next two (2.5 s and 5 s later) and back before the
    // row expires (stopping and starting take well under a second here).
    let beat = "SELECT extract(epoch FROM heartbeat_at)::float8 FROM subagents_nodes";
    let joined: f64 = query_value(&url, beat);
    poll_until("the next heartbeat", || {
        query_value::<f64>(&url, beat) > joined
    });
    let beaten = std::time::Instant::now();
    server.down_for(Duration::from_millis(5400));
    assert!(
        beaten.elapsed() < TTL,
        "the server was back within the time-to-live"
    );
    // Past the time-to-live since the last beat before the server went down.
    std::thread::sleep((TTL + Duration::from_millis(500)).saturating_sub(beaten.elapsed()));
    assert!(
        !lost.is_cancelled(),
        "the membership outlived the server's absence"
    );
    let live = block_on(membership.live_among(&[membership.node()])).unwrap();
    assert_eq!(live.len(), 1, "its row is live");
}

// A terminated backend is a passing fault: every pooled connection dies, and the calls that
// come next (a lease, appends, a flush, reads, a node's deliveries) connect again and land,
// once each. Before, each failed with STORE_IO, and a session's failed write faulted its agent.
#[test]
fn terminated_backends_are_a_passing_fault() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let store = cluster_store(&url);
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    terminate_backends(&url);
    let lease = block_on(store.acquire_lease(id, LeaseHolder::new())).unwrap();
    terminate_backends(&url);
    block_on(store.append(id, 0, notes(0, 2), Some(lease.epoch))).unwrap();
    terminate_backends(&url);
    block_on(store.flush(id)).unwrap();
    terminate_backends(&url);
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 2);
    let (a, b) = (
        block_on(store.join(&LeaseHolder::new(), "a")).unwrap(),
        block_on(store.join(&LeaseHolder::new(), "b")).unwrap(),
    );
    b.serve(Arc::new(|delivery| {
        Box::pin(async move { Ok(delivery.payload) })
    }))
    .unwrap();
    for _ in 0..3 {
        terminate_backends(&url);
        block_on(a.holder_of(id)).unwrap();
        block_on(a.live_among(&[b.node()])).unwrap();
    }
    terminate_backends(&url);
    let answer = block_on(within(
        "the answer",
        a.deliver(b.node(), id, &serde_json::json!({ "n": 1 })),
    ))
    .unwrap();
    assert_eq!(answer, serde_json::json!({ "n": 1 }));
    let sent: i64 = query_value(&url, "SELECT count(*) FROM subagents_deliveries");
    assert_eq!(sent, 1, "sent once");
}

/// A store on a fresh database whose statements time out after `timeout` (and its url).
fn fresh_with_statement_timeout(timeout: Duration) -> Option<(PostgresStore, String)> {
    let url = postgres_or_skip!(None).fresh_database();
    let mut config = PostgresConfig::new(url.clone());
    config.statement_timeout = timeout;
    Some((block_on(PostgresStore::connect_with(config)).unwrap(), url))
}

// A statement the server cannot finish (another connection holds the session's row) fails its
// call within the statement timeout, cancelled by the server, which committed nothing: the
// caller is not held until the lock is released, and the connection serves again.
#[test]
fn a_statement_the_server_cannot_finish_fails_within_the_statement_timeout() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh_with_statement_timeout(Duration::from_millis(300)) else {
        return;
    };
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let holder = block_on(holding_session_row(&url, id));
    let began = std::time::Instant::now();
    let refused = block_on(within(
        "the append to answer",
        store.append(id, 0, notes(0, 1), None),
    ))
    .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        began.elapsed()
    );
    block_on(holder.batch_execute("ROLLBACK")).unwrap();
    block_on(store.append(id, 0, notes(0, 1), None)).expect("the cancelled append stored nothing");
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 1);
}

// A row another transaction holds past the statement timeout fails only its own append, not
// the others that share its statement: the batch skips it, and it waits for its row alone. Before,
// every append batched with it waited for the row and failed with it.
#[test]
fn a_held_row_fails_only_its_own_append_among_concurrent_ones() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh_with_statement_timeout(Duration::from_millis(300)) else {
        return;
    };
    let created = || empty_session(&store);
    let held = created();
    let free: Vec<SessionId> = (0..32).map(|_| created()).collect();
    let holder = block_on(holding_session_row(&url, held));
    let (refused, landed) = block_on(within(
        "the appends to answer",
        futures::future::join(
            store.append(held, 0, notes(0, 1), None),
            futures::future::join_all(
                free.iter()
                    .map(|id| store.append(*id, 0, notes(0, 2), None)),
            ),
        ),
    ));
    assert_eq!(refused.unwrap_err().code(), ErrorCode::StoreIo);
    for (id, landed) in free.iter().zip(landed) {
        landed.unwrap_or_else(|error| panic!("session {id}: {error}"));
        assert_eq!(block_on(store.read_from(*id, 0)).unwrap().len(), 2);
    }
    block_on(holder.batch_execute("ROLLBACK")).unwrap();
    block_on(store.append(held, 0, notes(0, 1), None)).expect("the failed append stored nothing");
}

// A session row another transaction holds past the statement timeout fails only its own
// leased cache write, not the others that share its statement: the batch skips it, and it
// waits for its row alone. Before, every write batched with it waited for the row and failed
// with it.
#[test]
fn a_held_row_fails_only_its_own_cache_write_among_concurrent_ones() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh_with_statement_timeout(Duration::from_millis(300)) else {
        return;
    };
    let leased = || {
        let id = empty_session(&store);
        let epoch = block_on(store.acquire_lease(id, LeaseHolder::new()))
            .unwrap()
            .epoch;
        (id, epoch)
    };
    let (held, held_epoch) = leased();
    let free: Vec<(SessionId, LeaseEpoch)> = (0..32).map(|_| leased()).collect();
    let holder = block_on(holding_session_row(&url, held));
    let row = |n: usize| serde_json::json!({ "n": n });
    let (refused, written) = block_on(within(
        "the cache writes to answer",
        futures::future::join(
            store.cache_put("unit", held, row(0), Some(held_epoch)),
            futures::future::join_all(
                free.iter()
                    .enumerate()
                    .map(|(n, (id, epoch))| store.cache_put("unit", *id, row(n), Some(*epoch))),
            ),
        ),
    ));
    assert_eq!(refused.unwrap_err().code(), ErrorCode::StoreIo);
    for ((n, (id, _)), written) in free.iter().enumerate().zip(written) {
        written.unwrap_or_else(|error| panic!("session {id}: {error}"));
        assert_eq!(
            block_on(store.cache_get("unit", *id)).unwrap(),
            Some(row(n))
        );
    }
    block_on(holder.batch_execute("ROLLBACK")).unwrap();
    assert_eq!(block_on(store.cache_get("unit", held)).unwrap(), None);
    block_on(store.cache_put("unit", held, row(0), Some(held_epoch)))
        .expect("the row is free again, and the lease still the session's");
}

// A session row, or a lease row, another transaction holds past the statement timeout fails
// only the lease grants of the sessions contended with it, not the others that share its
// batch: the batch's transaction skips those sessions, and a second grants them, waiting for
// their rows. Before, every grant batched with it waited for the row and failed with it.
#[test]
fn a_held_row_fails_only_its_own_lease_grant_among_concurrent_ones() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh_with_statement_timeout(Duration::from_millis(300)) else {
        return;
    };
    let created = || empty_session(&store);
    let (held_session, held_lease) = (created(), created());
    let holder = LeaseHolder::new();
    let first = block_on(store.acquire_lease(held_lease, holder.clone())).unwrap();
    let free: Vec<SessionId> = (0..32).map(|_| created()).collect();
    let session_holder = block_on(holding_session_row(&url, held_session));
    let lease_holder = block_on(holding_lease_row(&url, held_lease));
    let (refused, granted) = block_on(within(
        "the lease grants to answer",
        futures::future::join(
            futures::future::join(
                store.acquire_lease(held_session, LeaseHolder::new()),
                store.acquire_lease(held_lease, holder.clone()),
            ),
            futures::future::join_all(
                free.iter()
                    .map(|id| store.acquire_lease(*id, LeaseHolder::new())),
            ),
        ),
    ));
    assert_eq!(refused.0.unwrap_err().code(), ErrorCode::StoreIo);
    assert_eq!(refused.1.unwrap_err().code(), ErrorCode::StoreIo);
    for (id, granted) in free.iter().zip(granted) {
        let lease = granted.unwrap_or_else(|error| panic!("session {id}: {error}"));
        assert_eq!(lease.epoch, LeaseEpoch(1), "session {id}");
    }
    block_on(session_holder.batch_execute("ROLLBACK")).unwrap();
    block_on(lease_holder.batch_execute("ROLLBACK")).unwrap();
    let granted = block_on(store.acquire_lease(held_session, LeaseHolder::new()))
        .expect("the session's row is free again");
    assert_eq!(
        granted.epoch,
        LeaseEpoch(1),
        "the failed grant granted nothing"
    );
    let again = block_on(store.acquire_lease(held_lease, holder)).expect("its holder asks again");
    assert_eq!(
        again.epoch,
        LeaseEpoch(first.epoch.0 + 1),
        "the failed grant granted nothing"
    );
}

// A lease row another transaction holds past the statement timeout fails only the releases
// that met it, not the others that share its statement: the statement skips the row, and the
// release is sent again after it, waiting for the row. Before, every release batched with it
// waited for the row and failed with it.
#[test]
fn a_held_lease_row_fails_only_its_own_release_among_concurrent_ones() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url)) = fresh_with_statement_timeout(Duration::from_millis(300)) else {
        return;
    };
    let owner = LeaseHolder::new();
    let leased = || {
        let id = empty_session(&store);
        (
            id,
            block_on(store.acquire_lease(id, owner.clone()))
                .unwrap()
                .epoch,
        )
    };
    let (held, held_epoch) = leased();
    let free: Vec<(SessionId, LeaseEpoch)> = (0..32).map(|_| leased()).collect();
    let holder = block_on(holding_lease_row(&url, held));
    let (refused, released) = block_on(within(
        "the releases to answer",
        futures::future::join(
            store.release_lease(held, held_epoch),
            futures::future::join_all(
                free.iter()
                    .map(|(id, epoch)| store.release_lease(*id, *epoch)),
            ),
        ),
    ));
    assert_eq!(refused.unwrap_err().code(), ErrorCode::StoreIo);
    for ((id, _), released) in free.iter().zip(released) {
        released.unwrap_or_else(|error| panic!("session {id}: {error}"));
        // Free: another holder is granted it without taking it over.
        let next = block_on(store.acquire_lease(*id, LeaseHolder::new())).unwrap();
        assert_eq!(
            (next.epoch, next.taken_over),
            (LeaseEpoch(2), false),
            "session {id}"
        );
    }
    block_on(holder.batch_execute("ROLLBACK")).unwrap();
    let leased_still = block_on(store.acquire_lease(held, LeaseHolder::new())).unwrap_err();
    assert_eq!(
        leased_still.code(),
        ErrorCode::SessionLeased,
        "the failed release freed nothing"
    );
    block_on(store.release_lease(held, held_epoch)).expect("the row is free again");
    let next = block_on(store.acquire_lease(held, LeaseHolder::new())).unwrap();
    assert_eq!((next.epoch, next.taken_over), (LeaseEpoch(2), false));
}

/// A new session stored in `store` with no events.
fn empty_session(store: &PostgresStore) -> SessionId {
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    id
}

/// Stops (`SIGSTOP`) every client process of `url`'s database, as a paused machine's are, for
/// as long as the answer lives: they go on when it drops, a failed assert too. None of them may
/// be mid-call.
pub(crate) fn stop_client_backends(url: &str) -> StoppedBackends {
    let backends: Vec<u32> = block_on(async {
        let client = raw_client(url).await;
        client
            .query(
                "SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND backend_type = 'client backend'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| u32::try_from(row.get::<_, i32>(0)).unwrap())
            .collect()
    });
    assert!(!backends.is_empty(), "the store holds connections");
    let stopped = StoppedBackends(backends);
    for pid in &stopped.0 {
        signal(*pid, rustix::process::Signal::STOP);
    }
    stopped
}

/// Client processes stopped by [`stop_client_backends`], continued when this drops.
pub(crate) struct StoppedBackends(Vec<u32>);

impl Drop for StoppedBackends {
    fn drop(&mut self) {
        for pid in &self.0 {
            let pid = rustix::process::Pid::from_raw(i32::try_from(*pid).unwrap()).unwrap();
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
        }
    }
}

/// A store whose statements time out after 300 ms holding a session of two events, read once
/// (the read's connection open and idle, as before a server stops), with its url; in the
/// runtime the caller entered.
fn a_session_read_once() -> Option<(PostgresStore, String, SessionId)> {
    let (store, url) = fresh_with_statement_timeout(Duration::from_millis(300))?;
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), notes(0, 2))).unwrap();
    assert_eq!(block_on(store.read_from(id, 0)).unwrap().len(), 2);
    Some((store, url, id))
}

// A server that stops answering without closing its connections (its processes stopped, as
// a paused machine's are) fails a call once the deadline passes, instead of holding the
// caller until it answers again; once it answers, the store serves again.
#[test]
fn a_server_that_stops_answering_fails_a_call_within_its_deadline() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url, id)) = a_session_read_once() else {
        return;
    };
    let stopped = stop_client_backends(&url);
    let began = std::time::Instant::now();
    let answered = block_on(tokio::time::timeout(
        Duration::from_secs(10),
        store.read_from(id, 0),
    ));
    let waited = began.elapsed();
    drop(stopped);
    let refused = answered
        .expect("the read answered before the server did")
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
    let again = block_on(within(
        "a read once the server answers",
        store.read_from(id, 0),
    ));
    assert_eq!(again.unwrap().len(), 2, "the store serves again");
}

// A call that outlived its deadline closes its connection instead of handing it back: the
// next call is not queued behind the statement the server never answered. With every
// connection's server process stopped, each stopped connection fails one call at most, and
// a call on a fresh connection is answered while they are still stopped; continued, the
// stopped processes find their connections closed and end.
#[test]
fn a_call_past_its_deadline_does_not_hand_its_connection_to_the_next() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let Some((store, url, id)) = a_session_read_once() else {
        return;
    };
    let stopped = stop_client_backends(&url);
    let mut failed = 0;
    let answered = loop {
        match block_on(within("a read", store.read_from(id, 0))) {
            Ok(events) => break events,
            Err(error) => {
                assert_eq!(error.code(), ErrorCode::StoreIo, "{error}");
                failed += 1;
                assert!(
                    failed <= stopped.0.len(),
                    "{failed} reads failed on {} stopped connections: a timed-out \
                     connection was handed out again",
                    stopped.0.len()
                );
            }
        }
    };
    assert!(failed >= 1, "the first read waited on a stopped connection");
    assert_eq!(answered.len(), 2, "answered on a fresh connection");
    let pids: Vec<i32> = stopped
        .0
        .iter()
        .map(|pid| i32::try_from(*pid).unwrap())
        .collect();
    drop(stopped);
    // The connections that failed were closed: their server processes end once continued.
    poll_until("the timed-out connections' server processes to end", || {
        let left: i64 = block_on(async {
            raw_client(&url)
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)",
                    &[&pids],
                )
                .await
                .unwrap()
                .get(0)
        });
        left <= i64::try_from(pids.len() - failed).unwrap()
    });
}

// A server that accepts the connection and never answers its startup (a hung server, a port
// that is not PostgreSQL's) fails `connect` with `STORE_IO` at the pool's create timeout and
// keeps nothing of the attempt: its socket is closed then. Before, the attempt went on in a
// task of its own, holding its socket, for as long as the process lived.
#[test]
fn a_server_that_never_answers_the_startup_fails_connect_and_keeps_no_socket() {
    use std::io::Read;

    let runtime = runtime();
    let _entered = runtime.enter();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("host=127.0.0.1 port={port} user=nobody dbname=nothing");
    let connecting = runtime.spawn(async move { PostgresStore::connect(&url).await.map(drop) });
    let (mut socket, _) = listener.accept().expect("the store connects");
    let refused = block_on(tokio::time::timeout(Duration::from_secs(30), connecting))
        .expect("connect gave up within its create timeout")
        .expect("the connect ran")
        .expect_err("the server never answered");
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    // The startup message arrived; then the socket closes (a read past it would block, and
    // time out, while the attempt lived on).
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sent = Vec::new();
    let closed = socket.read_to_end(&mut sent);
    assert!(closed.is_ok(), "the attempt kept its socket: {closed:?}");
    assert!(!sent.is_empty(), "the startup message was sent");
}
