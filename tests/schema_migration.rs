//! The schema migration on PostgreSQL: runtimes starting at once migrate once, a newer schema
//! is refused, and a process waits for another's migration no longer than its statement
//! timeout.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use subagents::store::{PostgresConfig, PostgresStore};
use subagents::ErrorCode;

use crate::store::store_runtime as runtime;
use crate::store_postgres::{execute, query_value};
use crate::support::postgres::{postgres_or_skip, raw_client};
use crate::support::within;

#[test]
fn the_schema_migrates_once_and_a_newer_schema_is_refused() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    // Several runtimes starting at once migrate once, under the advisory lock.
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            runtime.spawn(async move { PostgresStore::connect(&url).await.map(drop) })
        })
        .collect();
    for start in block_on(futures::future::join_all(starts)) {
        start.unwrap().unwrap();
    }
    execute(&url, "INSERT INTO subagents_schema (version) VALUES (999)");
    let refused = block_on(PostgresStore::connect(&url)).unwrap_err();
    assert_eq!(refused.code(), ErrorCode::StoreCorrupt);
    assert!(
        refused.message().contains("version 999"),
        "{}",
        refused.message()
    );
    let unreachable = block_on(PostgresStore::connect(
        "host=/nonexistent port=1 user=x dbname=y",
    ))
    .unwrap_err();
    assert_eq!(unreachable.code(), ErrorCode::StoreIo);
    let malformed = block_on(PostgresStore::connect("postgres://[bad")).unwrap_err();
    assert_eq!(malformed.code(), ErrorCode::InvalidConfig);
}

/// The advisory lock key the store migrates under ("subagent" in ASCII).
const MIGRATION_LOCK: i64 = 0x7375_6261_6765_6e74;

// A process stopped while it migrates keeps the schema's lock: another process's `connect`
// waits for it no longer than its statement timeout, fails `STORE_IO` naming the migration,
// and migrates once the lock is free. Before, it waited with no deadline at all.
#[test]
fn a_connect_waits_for_another_processs_migration_no_longer_than_the_statement_timeout() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let migrating = block_on(raw_client(&url));
    block_on(migrating.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]))
        .expect("the migration lock");
    let mut config = PostgresConfig::new(&url);
    config.statement_timeout = Duration::from_millis(500);

    let asked = Instant::now();
    let refused = block_on(within(
        "a connect behind a stopped migration",
        PostgresStore::connect_with(config.clone()),
    ))
    .expect_err("the lock is held");
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    assert!(
        refused.message().contains("migration lock"),
        "{}",
        refused.message()
    );
    // The server's lock timeout (500 ms) answers, within the call's deadline (a second more).
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        query_value::<bool>(&url, "SELECT to_regclass('subagents_schema') IS NULL"),
        "nothing was migrated"
    );

    block_on(migrating.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]))
        .expect("the lock is released");
    block_on(within(
        "a connect once the lock is free",
        PostgresStore::connect_with(config),
    ))
    .expect("migrates");
    assert!(query_value::<i32>(&url, "SELECT max(version) FROM subagents_schema") >= 10);
}
