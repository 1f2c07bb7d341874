//! The schema of a [`PostgresStore`](super::PostgresStore): its migrations, applied in order
//! at connect under an advisory lock, so any number of runtimes may start against one
//! database at once.

use std::time::Duration;

use super::reconnect::within;
use super::{io, PostgresStore, CALL_GRACE};
use crate::error::{ErrorCode, Result, SubagentError};

/// The schema versions, applied in order; each runs once, in one transaction.
const MIGRATIONS: &[&str] = &[
    // 1: sessions, batches, leases, the projection cache.
    "CREATE TABLE subagents_sessions (
         id uuid PRIMARY KEY,
         parent uuid,
         header bytea NOT NULL,
         next_seq bigint NOT NULL,
         epoch bigint NOT NULL DEFAULT 0
     );
     CREATE INDEX subagents_sessions_by_parent ON subagents_sessions (parent, id);
     CREATE TABLE subagents_event_batches (
         session uuid NOT NULL REFERENCES subagents_sessions (id),
         first_seq bigint NOT NULL,
         events bytea NOT NULL,
         PRIMARY KEY (session, first_seq)
     );
     CREATE TABLE subagents_leases (
         session uuid PRIMARY KEY REFERENCES subagents_sessions (id),
         holder uuid NOT NULL,
         epoch bigint NOT NULL,
         expires_at timestamptz NOT NULL
     );
     CREATE TABLE subagents_projection_cache (
         unit text NOT NULL,
         session uuid NOT NULL,
         row bytea NOT NULL,
         PRIMARY KEY (unit, session)
     );",
    // 2: the row a flush writes (its synchronous commit makes every earlier append durable).
    "CREATE TABLE subagents_flushes (session uuid PRIMARY KEY, at timestamptz NOT NULL);",
    // 3: cluster membership: a member's leases live while its row does.
    "CREATE TABLE subagents_nodes (
         node uuid PRIMARY KEY,
         name text NOT NULL,
         started_at timestamptz NOT NULL DEFAULT now(),
         heartbeat_at timestamptz NOT NULL DEFAULT now(),
         expires_at timestamptz NOT NULL
     );",
    // 4: deliveries between nodes, served in id order per target.
    "CREATE TABLE subagents_deliveries (
         id bigserial PRIMARY KEY,
         target uuid NOT NULL,
         sender uuid NOT NULL,
         session uuid NOT NULL,
         payload bytea NOT NULL,
         ticket uuid NOT NULL,
         state text NOT NULL DEFAULT 'pending',
         answer bytea,
         sent_at timestamptz NOT NULL DEFAULT now(),
         answered_at timestamptz
     );
     CREATE INDEX subagents_deliveries_pending ON subagents_deliveries (target, id)
         WHERE state = 'pending';",
    // 5: deliveries about different sessions are served at once: a session's oldest pending
    // delivery is found by session.
    "CREATE INDEX subagents_deliveries_pending_by_session
         ON subagents_deliveries (target, session, id) WHERE state = 'pending';",
    // 6: a flush touches one of a fixed number of rows, not a row per session forever.
    "DROP TABLE subagents_flushes;
     CREATE TABLE subagents_flushes (slot integer PRIMARY KEY, at timestamptz NOT NULL);",
    // 7: node incarnations: each process that joins under a node id is a new incarnation, a
    // member's lease lives only while its own incarnation's row does, and a delivery records
    // the incarnation that claimed it.
    "ALTER TABLE subagents_nodes ADD COLUMN incarnation uuid;
     ALTER TABLE subagents_leases ADD COLUMN incarnation uuid;
     ALTER TABLE subagents_deliveries ADD COLUMN claimed_by uuid;",
    // 8: a delivery is sent once per ticket: a send retried after its connection was lost
    // finds the row it may have committed.
    "CREATE UNIQUE INDEX subagents_deliveries_by_ticket ON subagents_deliveries (ticket);",
    // 9: a delivery names the incarnation of its sender that sent it: a node that hears from
    // another checks it against the incarnation it knows holds what the delivery is about.
    "ALTER TABLE subagents_deliveries ADD COLUMN sent_by uuid;",
    // 10: the batches of events and the projection rows (a few KB each: past the size at
    // which the server compresses a value) are compressed with lz4, a quarter of the default
    // pglz's cost to write, for about as many bytes. A server built without lz4 (or older than
    // PostgreSQL 14) keeps its default.
    "DO $$ BEGIN
         EXECUTE 'ALTER TABLE subagents_event_batches ALTER COLUMN events SET COMPRESSION lz4';
         EXECUTE 'ALTER TABLE subagents_projection_cache ALTER COLUMN row SET COMPRESSION lz4';
     EXCEPTION WHEN feature_not_supported OR syntax_error THEN NULL;
     END $$;",
];

/// The advisory lock key that serializes migrations across runtimes ("subagent" in ASCII).
const MIGRATION_LOCK: i64 = 0x7375_6261_6765_6e74;

/// The error of a migration that could not take the schema's lock: `STORE_IO`, naming another
/// process's migration when the server gave up waiting for it.
fn migration_lock_refused(error: tokio_postgres::Error, waited: Duration) -> SubagentError {
    if error.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        SubagentError::new(
            ErrorCode::StoreIo,
            format!(
                "another process has held the schema's migration lock for longer than \
                 {waited:?} (a migration still running, or a process stopped while migrating)"
            ),
        )
        .with_source(error)
    } else {
        SubagentError::store_io("locking the schema", error)
    }
}

/// The schema version this crate writes.
pub(super) fn known_version() -> i32 {
    i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX)
}

/// The database's schema version, or `None` when it has no `subagents` schema.
pub(super) async fn schema_version(client: &tokio_postgres::Client) -> Result<Option<i32>> {
    let exists: bool = client
        .query_one("SELECT to_regclass('subagents_schema') IS NOT NULL", &[])
        .await
        .map_err(io("reading the schema version"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    applied_version(client).await.map(Some)
}

/// The newest migration recorded in the schema table (0 when none is).
async fn applied_version(client: &impl tokio_postgres::GenericClient) -> Result<i32> {
    Ok(client
        .query_one(
            "SELECT coalesce(max(version), 0) FROM subagents_schema",
            &[],
        )
        .await
        .map_err(io("reading the schema version"))?
        .get(0))
}

impl PostgresStore {
    /// Applies the migrations this database has not seen, under an advisory lock.
    ///
    /// Bounded throughout: no lock is waited for longer than the statement timeout (another
    /// process's migration, or a table's users for the DDL), no answer before the lock is held
    /// longer than the call deadline, and the migration itself no longer than the migration
    /// timeout, on the server and at the client (see [`PostgresConfig::migration_timeout`]).
    /// A migration that fails in any way closes its connection: a statement of it may still be
    /// running on a server that stopped answering, and closing ends its transaction there.
    ///
    /// [`PostgresConfig::migration_timeout`]: super::PostgresConfig::migration_timeout
    pub(super) async fn migrate(&self) -> Result<()> {
        let mut client = self.client().await?;
        let migrated = self.migrate_on(&mut client).await;
        if migrated.is_err() {
            client.close();
        }
        migrated
    }

    async fn migrate_on(&self, client: &mut super::pool::Pooled) -> Result<()> {
        // Up to date already: no lock and no DDL (a reader's role may not create tables).
        let version = self
            .bounded("reading the schema version", schema_version(client))
            .await?;
        if version == Some(known_version()) {
            return Ok(());
        }
        let lock_wait = self.call_deadline.saturating_sub(CALL_GRACE);
        let settings = format!(
            "SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}; \
             SET LOCAL idle_in_transaction_session_timeout = {}",
            self.migration_timeout.as_millis(),
            lock_wait.as_millis(),
            self.call_deadline.as_millis(),
        );
        let tx = self
            .bounded("starting the schema migration", async {
                let tx = client
                    .transaction()
                    .await
                    .map_err(io("starting the schema migration"))?;
                tx.batch_execute(&settings)
                    .await
                    .map_err(io("setting the migration's timeouts"))?;
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                    .await
                    .map_err(|error| migration_lock_refused(error, lock_wait))?;
                Ok(tx)
            })
            .await?;
        within(
            "applying the schema migration",
            self.migration_timeout.saturating_add(CALL_GRACE),
            apply_migrations(tx),
        )
        .await
    }
}

/// Applies the migrations `tx` (holding the schema's lock) has not seen, and commits.
async fn apply_migrations(tx: deadpool_postgres::Transaction<'_>) -> Result<()> {
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS subagents_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(io("creating the schema table"))?;
    let applied = applied_version(&*tx).await?;
    let known = known_version();
    if applied > known || applied < 0 {
        return Err(SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("the database's schema is version {applied}, newer than this crate's {known}"),
        ));
    }
    for (version, migration) in (1..)
        .zip(MIGRATIONS)
        .skip(usize::try_from(applied).unwrap_or(0))
    {
        tx.batch_execute(migration)
            .await
            .map_err(io(format!("applying schema version {version}")))?;
        tx.execute(
            "INSERT INTO subagents_schema (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(io("recording the schema version"))?;
        tracing::info!(version, "PostgreSQL schema migrated");
    }
    tx.commit()
        .await
        .map_err(io("committing the schema migration"))
}
