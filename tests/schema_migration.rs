//! The schema migration on PostgreSQL: runtimes starting at once migrate once, a newer schema
//! is refused, a process waits for another's migration no longer than its statement timeout,
//! and a migration whose server stops answering gives up at its migration timeout.

use std::time::{Duration, Instant};

use futures::executor::block_on;
use subagents::store::{PostgresConfig, PostgresStore};
use subagents::ErrorCode;

use crate::store::store_runtime as runtime;
use crate::store_postgres::{execute, poll_until, query_value, stop_client_backends};
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

/// Migrates the database at `url`, then puts it one migration behind: the last one runs
/// again (it may: it only sets the columns' compression), and it must lock the event batches,
/// which the answered client holds in an open transaction (`ROLLBACK` frees them).
fn one_migration_behind_with_its_table_held(url: &str) -> tokio_postgres::Client {
    block_on(PostgresStore::connect(url)).expect("migrates");
    execute(url, "DELETE FROM subagents_schema WHERE version = 10");
    let holder = block_on(raw_client(url));
    block_on(
        holder.batch_execute("BEGIN; LOCK TABLE subagents_event_batches IN ACCESS EXCLUSIVE MODE"),
    )
    .expect("the table's lock");
    holder
}

/// Waits (bounded) until a migration waits for the table another client holds.
fn until_a_migration_waits_for_the_table(url: &str) {
    poll_until("the migration to wait for the table", || {
        query_value::<i64>(
            url,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ) == 1
    });
}

// A migration whose server stops answering part-way (its backend stopped, as a paused
// machine's is, while the DDL waits for a table's users) fails `connect` with `STORE_IO` once
// its migration timeout passes, and applies nothing; once the server answers again, the next
// `connect` migrates. Before, the migration's statements had no deadline and `connect` waited
// for as long as the server did.
#[test]
fn a_migration_whose_server_stops_answering_fails_within_its_migration_timeout() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let holder = one_migration_behind_with_its_table_held(&url);
    let mut config = PostgresConfig::new(&url);
    config.migration_timeout = Duration::from_secs(3);

    let asked = Instant::now();
    let connecting = runtime.spawn(PostgresStore::connect_with(config.clone()));
    until_a_migration_waits_for_the_table(&url);
    let stopped = stop_client_backends(&url);
    let refused = block_on(within("the migration to give up", connecting))
        .expect("the connect ran")
        .expect_err("the server stopped answering");
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    // The client's deadline answered (the server's own statement timeout could not run).
    assert!(
        refused.message().contains("applying the schema migration")
            && refused.message().contains("did not answer"),
        "{}",
        refused.message()
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );

    drop(stopped);
    block_on(holder.batch_execute("ROLLBACK")).expect("the table is free");
    assert_eq!(
        query_value::<i32>(&url, "SELECT max(version) FROM subagents_schema"),
        9,
        "nothing was applied"
    );
    block_on(within(
        "a connect once the server answers",
        PostgresStore::connect_with(config),
    ))
    .expect("migrates");
    assert_eq!(
        query_value::<i32>(&url, "SELECT max(version) FROM subagents_schema"),
        10
    );
}

// A migrating process that stops answering itself (its every thread stopped, as a paused
// machine's are) while it holds the schema's locks holds them no longer than its call
// deadline: the server ends its transaction once it has been idle in it that long, and
// another process migrates. Before, nothing ended it, and every statement on the locked
// tables waited for the stopped process.
#[test]
fn a_migrating_process_that_stops_answering_releases_the_schema_within_its_call_deadline() {
    let runtime = runtime();
    let _entered = runtime.enter();
    let url = postgres_or_skip!().fresh_database();
    let holder = one_migration_behind_with_its_table_held(&url);
    // Locks are waited for as long as a statement runs (2 s); an idle transaction lives as
    // long as a call is waited for (3 s).
    let mut config = PostgresConfig::new(&url);
    config.statement_timeout = Duration::from_secs(2);

    // The migrating process: everything of its store on one thread, which the test stops.
    let migrating = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let process = migrating.handle().clone();
    let connecting = std::thread::spawn({
        let config = config.clone();
        move || {
            migrating
                .block_on(PostgresStore::connect_with(config))
                .map(drop)
        }
    });
    until_a_migration_waits_for_the_table(&url);
    let (stopped, stop) = std::sync::mpsc::channel::<()>();
    let (go_on, resume) = std::sync::mpsc::channel::<()>();
    process.spawn(async move {
        stopped.send(()).unwrap();
        // Blocks the process's only thread: nothing of it runs until the test says so.
        let _ = resume.recv();
    });
    stop.recv().expect("the process stopped");
    // The migration gets the table and runs its statement; its process never sends the next.
    block_on(holder.batch_execute("ROLLBACK")).expect("the table is free");

    poll_until("the stopped migration's locks to be released", || {
        // A bigint key's advisory lock is listed by its halves.
        query_value::<bool>(
            &url,
            &format!(
                "SELECT count(*) = 0 FROM pg_locks
                 WHERE locktype = 'advisory' AND classid = {} AND objid = {}",
                MIGRATION_LOCK >> 32,
                MIGRATION_LOCK & 0xffff_ffff
            ),
        )
    });
    go_on.send(()).unwrap();
    let ended = connecting
        .join()
        .expect("the stopped process's connect returned");
    let refused = ended.expect_err("its transaction was ended");
    assert_eq!(refused.code(), ErrorCode::StoreIo, "{refused}");
    block_on(within(
        "another process's connect",
        PostgresStore::connect_with(config),
    ))
    .expect("migrates");
    assert_eq!(
        query_value::<i32>(&url, "SELECT max(version) FROM subagents_schema"),
        10
    );
}
