//! Cluster membership on PostgreSQL: a node's id belongs to one process at a time. A second
//! process under a live node's id is refused, a dead one's row is taken over as a new
//! incarnation (however the row expires around the join's watch), a node declared dead learns
//! it, and a node that leaves removes its row.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use subagents::store::{LeaseHolder, PostgresConfig, PostgresStore};
use subagents::{ErrorCode, SessionHeader, SessionId, SessionPersistence};

use crate::store::store_runtime as runtime;
use crate::store_postgres::{
    cluster_store, execute, poll_until, query_value, stop_client_backends,
};
use crate::support::postgres::{postgres_or_skip, raw_client};
use crate::support::within;

// A node whose row expired (it was paused past its time-to-live) learns that its membership is
// lost, is not revived by a late heartbeat, serves no delivery sent to it after, and cannot join
// again under the same id, even once it has left; its later leases are plain ones, renewed
// lease by lease.
#[test]
fn a_node_declared_dead_learns_it_and_cannot_rejoin() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let store = cluster_store(&url);
    let node = LeaseHolder::new();
    let membership = block_on(store.join(&node, "paused")).unwrap();
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&served);
    membership
        .serve(Arc::new(
            move |delivery: subagents::store::deliveries::Delivery| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move { Ok(delivery.payload) })
            },
        ))
        .unwrap();
    execute(
        &url,
        "UPDATE subagents_nodes SET expires_at = now() - interval '1 second'",
    );
    block_on(within("the lost membership", membership.lost().cancelled()));
    let expired: bool = query_value(
        &url,
        "SELECT bool_and(expires_at < now()) FROM subagents_nodes",
    );
    assert!(expired, "no heartbeat revived the row");
    let peer = block_on(cluster_store(&url).join(&LeaseHolder::new(), "peer")).unwrap();
    let unserved = block_on(within(
        "the withdrawn delivery",
        peer.deliver(node.id(), SessionId::new(), &serde_json::json!({ "n": 1 })),
    ))
    .unwrap_err();
    assert_eq!(unserved.code(), ErrorCode::SessionLeased);
    assert_eq!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a node declared dead serves nothing"
    );
    block_on(membership.leave()).unwrap();
    let again = block_on(store.join(&node, "paused")).unwrap_err();
    assert_eq!(again.code(), ErrorCode::LeaseLost);
    let id = SessionId::new();
    block_on(store.create(SessionHeader::new(id), vec![])).unwrap();
    let lease = block_on(store.acquire_lease(id, node)).unwrap();
    assert_eq!(lease.ttl, Some(Duration::from_millis(300)));
}

// Leaving removes the node's row at once.
#[test]
fn a_node_that_leaves_removes_its_row() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let store = cluster_store(&url);
    let membership = block_on(store.join(&LeaseHolder::new(), "leaving")).unwrap();
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "leaving");
    block_on(membership.leave()).unwrap();
    let rows: i64 = query_value(&url, "SELECT count(*) FROM subagents_nodes");
    assert_eq!(rows, 0);
}

// A node's id is one process's at a time: a second process joining under the id of a node
// that heartbeats is refused, and the first keeps its row; once that process died (its row no
// longer renewed), a process restarted under the id takes the row over, and so does one started
// after the row expired (before incarnations the node, declared dead, could not join again).
#[test]
fn a_second_process_under_a_live_nodes_id_is_refused_and_a_dead_ones_is_taken_over() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let id = uuid::Uuid::new_v4();
    let first = block_on(cluster_store(&url).join(&LeaseHolder::with_id(id), "first")).unwrap();
    let second = block_on(within(
        "the refusal",
        cluster_store(&url).join(&LeaseHolder::with_id(id), "second"),
    ))
    .unwrap_err();
    assert_eq!(second.code(), ErrorCode::SessionLeased, "{second}");
    assert!(
        second.message().contains("live in another process"),
        "{second}"
    );
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "first");
    // The first process dies: its row stays until it expires, renewed by nobody.
    drop(first);
    let restarted = block_on(within(
        "the takeover",
        cluster_store(&url).join(&LeaseHolder::with_id(id), "restarted"),
    ))
    .unwrap();
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "restarted");
    // It dies too, and its row expires (it was declared dead): a process started under the
    // id later still joins, as a new incarnation.
    let dead = restarted.incarnation();
    drop(restarted);
    execute(
        &url,
        "UPDATE subagents_nodes SET expires_at = now() - interval '1 second'",
    );
    let late = block_on(within(
        "the late restart",
        cluster_store(&url).join(&LeaseHolder::with_id(id), "late"),
    ))
    .unwrap();
    assert_ne!(late.incarnation(), dead);
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "late");
}

// A process whose node row another process took over under the same id (it was paused past
// the takeover's watch, then woke) no longer belongs: its next heartbeat finds the row another
// incarnation's and reports the membership lost (its server stops). Before incarnations the
// woken process renewed the row it shared with its successor and served beside it.
#[test]
fn a_process_whose_node_was_taken_over_loses_its_membership() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let id = uuid::Uuid::new_v4();
    let paused = block_on(cluster_store(&url).join(&LeaseHolder::with_id(id), "paused")).unwrap();
    assert_ne!(paused.incarnation(), uuid::Uuid::nil());
    // The takeover, as a process joining under the id writes it.
    execute(
        &url,
        "UPDATE subagents_nodes SET incarnation = gen_random_uuid(), name = 'restarted'",
    );
    block_on(within("the lost membership", paused.lost().cancelled()));
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "restarted", "the successor's row is left alone");
}

/// Polls (bounded) until some connection to `url`'s database other than the asking one
/// matches `condition` in `pg_stat_activity`: what another connection is doing is known only
/// to the server.
fn until_a_backend(url: &str, condition: &str) {
    let asked = format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND {condition}"
    );
    poll_until(&format!("a backend with {condition}"), || {
        query_value::<i64>(url, &asked) > 0
    });
}

// A process restarted under the id of a node that died finds its row still live, watches it for
// half a time-to-live, and sees no heartbeat. If the row expires after that watch and before the
// row is written, the node is still dead, and the new process takes the row over. Before, the
// join read the row and then wrote it in two statements, the write asked for a row that had not
// expired, and the new process was refused as if another process ran the node (seen in the
// fault campaign as `SESSION_LEASED` for a worker restarted after SIGKILL).
#[test]
fn a_dead_nodes_row_expiring_during_the_takeover_is_still_taken_over() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let id = uuid::Uuid::new_v4();
    let mut config = PostgresConfig::new(url.clone());
    // The join watches for half of it: long enough to take the table lock below meanwhile.
    config.node_ttl = Duration::from_secs(4);
    let store = Arc::new(block_on(PostgresStore::connect_with(config)).unwrap());
    // The process that died: its row looks live for a minute, and nothing renews it.
    execute(
        &url,
        &format!(
            "INSERT INTO subagents_nodes (node, name, expires_at, incarnation)
             VALUES ('{id}', 'dead', now() + interval '1 minute', gen_random_uuid())"
        ),
    );
    let joining = runtime.spawn({
        let store = Arc::clone(&store);
        async move { store.join(&LeaseHolder::with_id(id), "restarted").await }
    });
    // The join read the row's heartbeat and watches it. Writes to the table wait from now on
    // (reads do not), so the join's write is held until the row has expired.
    until_a_backend(&url, "query LIKE 'SELECT heartbeat_at%'");
    let locker = block_on(async {
        let client = raw_client(&url).await;
        client
            .batch_execute("BEGIN; LOCK TABLE subagents_nodes IN EXCLUSIVE MODE")
            .await
            .unwrap();
        client
    });
    until_a_backend(&url, "wait_event_type = 'Lock'");
    block_on(locker.batch_execute(
        "UPDATE subagents_nodes SET expires_at = now() - interval '1 second'; COMMIT",
    ))
    .unwrap();
    let membership = block_on(within("the join", joining))
        .unwrap()
        .expect("the dead node's row is taken over");
    let name: String = query_value(&url, "SELECT name FROM subagents_nodes");
    assert_eq!(name, "restarted");
    let incarnation: uuid::Uuid = query_value(&url, "SELECT incarnation FROM subagents_nodes");
    assert_eq!(incarnation, membership.incarnation());
}

// A node leaving while its server has stopped answering (its processes stopped, as a paused
// machine's are, so no connection closes) fails within the store's call deadline instead of
// holding the node's shutdown for as long as the server is away; its row then expires on its
// own. Before, the leave's statement had no deadline and answered only once the server did.
#[test]
fn a_leave_the_server_does_not_answer_fails_within_the_deadline() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let mut config = PostgresConfig::new(url.clone());
    config.statement_timeout = Duration::from_millis(300);
    let store = Arc::new(block_on(PostgresStore::connect_with(config)).unwrap());
    let membership = block_on(store.join(&LeaseHolder::new(), "leaving")).unwrap();
    // The join's connection is idle in the pool: the leave takes it.
    let stopped = stop_client_backends(&url);
    let began = std::time::Instant::now();
    let answered = block_on(tokio::time::timeout(
        Duration::from_secs(10),
        membership.leave(),
    ));
    let waited = began.elapsed();
    drop(stopped);
    let refused = answered
        .expect("the leave answered before the server did")
        .unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    assert!(waited >= Duration::from_millis(300), "waited {waited:?}");
}
