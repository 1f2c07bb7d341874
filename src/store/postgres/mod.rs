//! Provides [`PostgresStore`]: [`SessionPersistence`] over PostgreSQL, for runtimes that share
//! sessions across processes and machines.
//!
//! # Layout
//! - `subagents_sessions`: one row per session (id, parent, header JSON, the next seq, the
//!   fencing epoch). The parent column is the children index.
//! - `subagents_event_batches`: one row per append (session, first seq, the events as a JSON
//!   array), as the sled store keeps them.
//! - `subagents_leases`: one row per held lease (session, holder, epoch, expiry).
//! - `subagents_projection_cache`: one row per (unit, session).
//! - `subagents_nodes`: one row per runtime that joined the cluster (see [`membership`]).
//! - `subagents_deliveries`: one row per delivery between nodes (see [`deliveries`]).
//!
//! # Guarantees
//! Compare-and-append is one statement: it locks the session row, checks the expected seq and
//! the writer's epoch, inserts the batch and moves the head together, so two writers never
//! interleave and a fenced-out writer changes nothing (`LEASE_LOST`, as on sled). The
//! connections run with `synchronous_commit=off`: a commit is visible to every reader when it
//! returns, and reaches the disk within the server's WAL writer delay (three times
//! `wal_writer_delay` at worst, 600 ms by default); a server crash in that window loses it.
//! `flush` commits synchronously, which makes every earlier commit durable. Leases expire after their time-to-live unless renewed; a holder of this process that
//! is gone (its runtime dropped) holds nothing, as on the embedded stores. A holder that joined
//! the cluster as a node ([`PostgresStore::join`]) renews nothing: its leases live while its
//! node heartbeats.
//!
//! # Schema
//! The crate creates and migrates its tables itself, at [`PostgresStore::connect`], under an
//! advisory lock, so any number of runtimes may start against one database at once. A process
//! waits for another's migration at most the statement timeout (`STORE_IO` past it), so one
//! stopped while migrating holds no other `connect` forever.

mod batch;
mod creations;
pub mod deliveries;
mod lease_book;
mod leases;
mod membership;
mod reads;
mod reconnect;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_postgres::NoTls;

use super::codec::{decode_cache_row, decode_header, encode_batch, put_value_row};
use super::lease::{lease_expired, lease_lost, Lease, LeaseEpoch, LeaseHolder};
use super::EncodedRow;
use super::{
    check_append, check_contiguous, not_found, ListedSession, SessionPersistence, StoredSession,
};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

use batch::Batcher;
use creations::CreationRequest;
use lease_book::LeaseBook;
use leases::LeaseRequest;
use reads::{ReadRequest, StoredRows};
use reconnect::reconnecting;

pub use membership::{NodeIncarnation, NodeMembership};
pub use reconnect::RECONNECT_WITHIN;

/// Whether the lease row `lease`, joined with its holder's row `node`, is held now: a node's
/// lease while the incarnation that took it has a live row (a restart under the node's id frees
/// it at once), any other while its own expiry is ahead. One rule for every statement that asks;
/// "now" is the statement's start unless a clock expression is given.
macro_rules! lease_live {
    () => {
        $crate::store::postgres::lease_live!("now()")
    };
    ($clock:literal) => {
        concat!(
            "CASE WHEN lease.incarnation IS NULL THEN lease.expires_at > ",
            $clock,
            " ELSE coalesce(node.expires_at > ",
            $clock,
            " AND node.incarnation = lease.incarnation, false) END"
        )
    };
}
pub(super) use lease_live;

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

/// The fewest remembered lease holders at which gone ones are swept.
const HOLDERS_SWEPT_FROM: usize = 64;

/// How many rows `flush` writes in turn: each connection touches the one its server process
/// id picks, so the table stays this small and concurrent flushes rarely share a row.
const FLUSH_SLOTS: i32 = 256;

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a store call waits for a free connection before failing (`STORE_IO`).
const POOL_WAIT: Duration = Duration::from_secs(30);

/// The runtime the caller runs on; the store needs one (see [`OnStoreRuntime`]).
fn store_runtime() -> Result<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current().map_err(|_| {
        SubagentError::new(
            ErrorCode::NoActorSystem,
            "the PostgreSQL store is used inside the actor system (a tokio runtime)",
        )
    })
}

/// How many batches of reads, of creations and of leases, each, run at once (each on a
/// connection of its own).
const BATCH_SLOTS: usize = 2;

/// A pool of at most `size` connections, opened on `runtime` (see [`OnStoreRuntime`]).
fn open_pool(
    pg: &tokio_postgres::Config,
    runtime: &tokio::runtime::Handle,
    size: usize,
) -> Result<Pool> {
    let manager = Manager::from_connect(
        pg.clone(),
        OnStoreRuntime {
            runtime: runtime.clone(),
        },
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                "the connection pool does not build",
            )
            .with_source(error)
        })
}

/// A batch's answers: each call's own, or the batch's failure for every call.
fn each_or_all<T>(answered: Result<Vec<Result<T>>>, calls: usize) -> Vec<Result<T>> {
    match answered {
        Ok(answers) => answers,
        Err(error) => (0..calls).map(|_| Err(error.clone())).collect(),
    }
}

/// Opens the pool's connections on the runtime that opened the store, whichever thread asks
/// for one. A connection's socket and its driving task belong to the runtime they start on, and
/// agents run on worker threads that stop before the store is done with (a load run verifies
/// after its workers stopped): a connection opened there would die with its worker, and the
/// pool would hand it out dead.
struct OnStoreRuntime {
    runtime: tokio::runtime::Handle,
}

/// A connection of the pool: its client and the task driving it.
type Opened = (tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl deadpool_postgres::Connect for OnStoreRuntime {
    fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, std::result::Result<Opened, tokio_postgres::Error>> {
        let config = config.clone();
        let opening = self
            .runtime
            .spawn(open_on(config.clone(), self.runtime.clone()));
        Box::pin(async move {
            match opening.await {
                Ok(opened) => opened,
                // The store's runtime has shut down: open it here, the best left to do.
                Err(_) => open_on(config, tokio::runtime::Handle::current()).await,
            }
        })
    }
}

/// Opens a connection and drives it on `runtime` (the one this runs on).
async fn open_on(
    config: tokio_postgres::Config,
    runtime: tokio::runtime::Handle,
) -> std::result::Result<Opened, tokio_postgres::Error> {
    let (client, connection) = config.connect(NoTls).await?;
    let driving = runtime.spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "a PostgreSQL connection failed");
        }
    });
    Ok((client, driving))
}

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

/// How a [`PostgresStore`] connects.
#[derive(Clone)]
pub struct PostgresConfig {
    /// A libpq-style connection string or URL (`postgres://user@host/db`,
    /// `host=/run/postgresql dbname=subagents`).
    pub url: String,
    /// How long a lease lasts unrenewed (default 30 s): a runtime that dies holds its
    /// sessions no longer than this.
    pub lease_ttl: Duration,
    /// The most connections the pool opens (default 16).
    pub pool_size: usize,
    /// How long a node that joined the cluster keeps its row, and with it its leases, without
    /// a heartbeat (default 10 s; it heartbeats every third of this).
    pub node_ttl: Duration,
    /// How long a delivery between nodes is kept once answered or withdrawn, or once sent to
    /// a node no longer live (default 5 minutes): a serving node prunes older rows every
    /// minute, or every retention period when that is shorter. Keep it well above the time a
    /// sender takes to read an answer (a pruned answer reads as `STORE_IO`).
    pub delivery_retention: Duration,
    /// How long the row of a node declared dead is kept (default 1 hour), the record of its
    /// death; a serving node prunes older ones with the deliveries. A new process may join
    /// under the node's id meanwhile, as a new incarnation (which fences whatever the dead one
    /// held); the process that was declared dead may not.
    pub dead_node_retention: Duration,
    /// How long a node waits for another node's answer to a delivery (default 30 s): no
    /// cross-node ask waits longer. On expiry a delivery not yet taken is withdrawn, and the
    /// sender gets `NODE_UNRESPONSIVE`.
    pub delivery_deadline: Duration,
    /// The longest a statement runs on the server (the connections' `statement_timeout`,
    /// default 60 s, from 1 ms to `i32::MAX` ms) and, a second later, the longest each
    /// attempt of a store call waits for the server's answer (a call tried again after a lost
    /// connection waits at most [`RECONNECT_WITHIN`] more): a server that stops answering
    /// without closing the connection (paused, partitioned, stuck on its disk) fails the call
    /// with `STORE_IO` instead of holding its caller forever. A call that timed out may still
    /// have committed: an append's log faults, as on any failed write, and a resume reads what
    /// the store holds; a lease granted unseen passes on as any lease does. A connection whose
    /// call timed out goes back to the pool and serves its next call once the server answers
    /// the one in flight. A schema migration's DDL is the one statement without a deadline; its
    /// wait for another process's migration has this one (`STORE_IO` naming that migration).
    /// Raise it for logs so long that reading one whole takes longer.
    pub statement_timeout: Duration,
}

/// Never shows the connection string: it may hold a password.
impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &"<redacted>")
            .field("lease_ttl", &self.lease_ttl)
            .field("pool_size", &self.pool_size)
            .field("node_ttl", &self.node_ttl)
            .field("delivery_retention", &self.delivery_retention)
            .field("dead_node_retention", &self.dead_node_retention)
            .field("delivery_deadline", &self.delivery_deadline)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

impl PostgresConfig {
    /// A configuration for `url` with the defaults.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            lease_ttl: Duration::from_secs(30),
            pool_size: 16,
            node_ttl: Duration::from_secs(10),
            delivery_retention: Duration::from_secs(300),
            dead_node_retention: Duration::from_secs(3600),
            delivery_deadline: Duration::from_secs(30),
            statement_timeout: Duration::from_secs(60),
        }
    }
}

/// How much longer than its statements' server-side timeout a store call waits for an
/// answer: the server's own cancellation (an error that names it) usually answers first.
const CALL_GRACE: Duration = Duration::from_secs(1);

/// How a [`PostgresStore`]'s reads, creations and lease grants coalesced, since it opened
/// ([`PostgresStore::batched_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchedCalls {
    /// Header and log reads asked for.
    pub reads: u64,
    /// The statements that answered them.
    pub read_statements: u64,
    /// Session creations asked for.
    pub creations: u64,
    /// The statements that answered them.
    pub creation_statements: u64,
    /// Lease grants asked for.
    pub leases: u64,
    /// The transactions that answered them.
    pub lease_transactions: u64,
}

/// A lease as granted, and what its row says.
#[derive(Debug, Clone, Copy)]
struct LeaseTerms {
    lease: Lease,
    /// The row's time-to-live, in seconds.
    row_ttl: f64,
    /// The node incarnation whose row keeps the lease live (a member's lease).
    incarnation: Option<uuid::Uuid>,
}

/// [`SessionPersistence`] over PostgreSQL.
pub struct PostgresStore {
    pool: Pool,
    /// For connections of their own (a node's listener).
    pg_config: tokio_postgres::Config,
    lease_ttl: Duration,
    node_ttl: Duration,
    delivery_retention: Duration,
    dead_node_retention: Duration,
    delivery_deadline: Duration,
    /// The longest a call waits for the server's answer ([`PostgresConfig::statement_timeout`]
    /// and [`CALL_GRACE`]).
    call_deadline: Duration,
    /// The lease holders of this process, shared with the lease batches.
    book: Arc<LeaseBook>,
    /// Header and log reads, batched (see [`batch`]).
    reads: Batcher<ReadRequest, StoredRows>,
    /// Session creations, batched (see [`batch`]): `true` for each one created.
    creations: Batcher<CreationRequest, bool>,
    /// Lease grants, batched (see [`batch`]).
    leases: Batcher<LeaseRequest, Lease>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("lease_ttl", &self.lease_ttl)
            .finish_non_exhaustive()
    }
}

fn io(what: impl std::fmt::Display) -> impl Fn(tokio_postgres::Error) -> SubagentError {
    let what = what.to_string();
    move |error| SubagentError::store_io(what.clone(), error)
}

fn pool_io(what: impl std::fmt::Display) -> impl Fn(deadpool_postgres::PoolError) -> SubagentError {
    let what = what.to_string();
    move |error| SubagentError::store_io(what.clone(), error)
}

/// A seq as PostgreSQL's `bigint`.
fn seq_column(seq: u64) -> Result<i64> {
    i64::try_from(seq).map_err(|_| SubagentError::bug(format!("seq {seq} exceeds bigint")))
}

/// A `bigint` column as a seq or epoch.
fn seq_value(column: i64) -> Result<u64> {
    u64::try_from(column).map_err(|_| {
        SubagentError::new(
            ErrorCode::StoreCorrupt,
            format!("a stored seq or epoch is negative: {column}"),
        )
    })
}

fn uuid_of(id: SessionId) -> uuid::Uuid {
    *id.as_uuid()
}

/// The schema version this crate writes.
fn known_version() -> i32 {
    i32::try_from(MIGRATIONS.len()).unwrap_or(i32::MAX)
}

/// The database's schema version, or `None` when it has no `subagents` schema.
async fn schema_version(client: &tokio_postgres::Client) -> Result<Option<i32>> {
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
    /// Connects with the defaults and migrates the schema.
    ///
    /// # Errors
    /// `STORE_IO` when the server cannot be reached or the schema cannot be migrated;
    /// `INVALID_CONFIG` for a malformed connection string.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(PostgresConfig::new(url)).await
    }

    /// Connects as `config` says and migrates the schema.
    ///
    /// # Errors
    /// As [`PostgresStore::connect`].
    pub async fn connect_with(config: PostgresConfig) -> Result<Self> {
        let store = Self::pool(config)?;
        // A schema migration's DDL takes what it takes; its waits are bounded (see there).
        store.migrate().await?;
        Ok(store)
    }

    /// The store over a pool for `config`, before any connection is opened.
    fn pool(config: PostgresConfig) -> Result<Self> {
        let mut pg: tokio_postgres::Config = config.url.parse().map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidConfig,
                "the PostgreSQL connection string does not parse",
            )
            .with_source(error)
        })?;
        // Appends commit without waiting for the disk; `flush` waits (see there). Every
        // statement is prepared once per connection and planned once: the batched reads'
        // plan cost five times their execution when planned per call, and a generic plan of
        // these index lookups is the custom one.
        // PostgreSQL takes at most `i32::MAX` milliseconds (and 0 would turn it off).
        let timeout_ms = match i32::try_from(config.statement_timeout.as_millis()) {
            Ok(0) | Err(_) => {
                return Err(SubagentError::new(
                    ErrorCode::InvalidConfig,
                    format!(
                        "the PostgreSQL statement timeout must be from 1 ms to {} ms, not {:?}",
                        i32::MAX,
                        config.statement_timeout
                    ),
                ))
            }
            Ok(ms) => ms,
        };
        // A statement the server cannot finish (a lock held elsewhere, say) is cancelled there
        // as its caller stops waiting for it, so the connection is free again.
        pg.options(format!(
            "-c synchronous_commit=off -c plan_cache_mode=force_generic_plan \
             -c statement_timeout={timeout_ms}"
        ));
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(CONNECT_TIMEOUT);
        }
        // A peer gone from the network (no reset ever comes) ends the connection once what
        // was sent stays unacknowledged this long, so the pool opens a fresh one.
        if pg.get_tcp_user_timeout().is_none() {
            pg.tcp_user_timeout(config.statement_timeout.max(CONNECT_TIMEOUT));
        }
        let call_deadline = config.statement_timeout.saturating_add(CALL_GRACE);
        let runtime = store_runtime()?;
        let pool = open_pool(&pg, &runtime, config.pool_size)?;
        // The batches' own connections: a burst of reads, creations and leases never queues
        // behind the appends, and each slot answers every call waiting when it frees.
        let lane = open_pool(&pg, &runtime, 3 * BATCH_SLOTS)?;
        let book = Arc::new(LeaseBook::new(config.lease_ttl, config.node_ttl));
        let reads = Batcher::start(&runtime, BATCH_SLOTS, {
            let lane = lane.clone();
            move |requests: Vec<ReadRequest>| {
                let lane = lane.clone();
                async move {
                    let answered = reconnecting("reading sessions", call_deadline, |_| {
                        reads::read_many(&lane, &requests)
                    })
                    .await;
                    each_or_all(answered, requests.len())
                }
            }
        });
        let creations = Batcher::start(&runtime, BATCH_SLOTS, {
            let (lane, book) = (lane.clone(), Arc::clone(&book));
            move |requests: Vec<CreationRequest>| {
                let (lane, book) = (lane.clone(), Arc::clone(&book));
                async move {
                    let answered = reconnecting("creating sessions", call_deadline, |attempt| {
                        creations::create_many(&lane, &book, &requests, attempt)
                    })
                    .await;
                    each_or_all(answered, requests.len())
                }
            }
        });
        let leases = Batcher::start(&runtime, BATCH_SLOTS, {
            let book = Arc::clone(&book);
            move |requests: Vec<LeaseRequest>| {
                let (lane, book) = (lane.clone(), Arc::clone(&book));
                async move {
                    // A batch whose commit was lost may have granted its leases: granted again,
                    // each holder gets a newer epoch (its own lease), which fences nothing live.
                    let answered = reconnecting("leasing sessions", call_deadline, |_| {
                        leases::grant_many(&lane, &book, &requests)
                    })
                    .await;
                    each_or_all(answered, requests.len())
                }
            }
        });
        let store = Self {
            pool,
            pg_config: pg,
            lease_ttl: config.lease_ttl,
            node_ttl: config.node_ttl,
            delivery_retention: config.delivery_retention,
            dead_node_retention: config.dead_node_retention,
            delivery_deadline: config.delivery_deadline,
            call_deadline,
            book,
            reads,
            creations,
            leases,
        };
        Ok(store)
    }

    /// Opens a store for reading what is there: like [`PostgresStore::connect`], but a
    /// database without this crate's schema is refused instead of migrated, so a mistyped
    /// database name never gets an empty store.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` when the database has no `subagents` schema; `STORE_CORRUPT` for a
    /// schema of another version; as [`PostgresStore::connect`] otherwise.
    pub async fn connect_existing(url: &str) -> Result<Self> {
        let store = Self::pool(PostgresConfig::new(url))?;
        let version = store
            .bounded("reading the schema version", async {
                schema_version(&*store.client().await?).await
            })
            .await?;
        match version {
            Some(version) if version == known_version() => Ok(store),
            Some(version) => Err(SubagentError::new(
                ErrorCode::StoreCorrupt,
                format!(
                    "the database's schema is version {version}, this crate's is {}",
                    known_version()
                ),
            )),
            None => Err(SubagentError::new(
                ErrorCode::SessionNotFound,
                "there is no subagents store in this database",
            )),
        }
    }

    /// Applies the migrations this database has not seen, under an advisory lock.
    ///
    /// Everything up to holding the lock is bounded: no lock is waited for longer than the
    /// statement timeout (another process's migration, or a table's users for the DDL), and
    /// no answer longer than the call deadline. Only the DDL's own work runs unbounded.
    async fn migrate(&self) -> Result<()> {
        let mut client = self.client().await?;
        // Up to date already: no lock and no DDL (a reader's role may not create tables).
        let version = self
            .bounded("reading the schema version", schema_version(&client))
            .await?;
        if version == Some(known_version()) {
            return Ok(());
        }
        let lock_wait = self.call_deadline.saturating_sub(CALL_GRACE);
        let tx = self
            .bounded("starting the schema migration", async {
                let tx = client
                    .transaction()
                    .await
                    .map_err(io("starting the schema migration"))?;
                tx.batch_execute(&format!(
                    "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = {}",
                    lock_wait.as_millis()
                ))
                .await
                .map_err(io("lifting the statement timeout for the migration"))?;
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
                    .await
                    .map_err(|error| migration_lock_refused(error, lock_wait))?;
                Ok(tx)
            })
            .await?;
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
                format!(
                    "the database's schema is version {applied}, newer than this crate's {known}"
                ),
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

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        // The pool's timeouts run on tokio: outside a runtime they would panic.
        store_runtime()?;
        self.pool.get().await.map_err(pool_io(format!(
            "connecting to PostgreSQL at {}",
            self.target()
        )))
    }

    /// Where the store connects, for a person: `host:port` (or the socket directory and
    /// port), every host the connection string names.
    fn target(&self) -> String {
        let ports = self.pg_config.get_ports();
        let targets: Vec<String> = self
            .pg_config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(index, host)| {
                let port = ports
                    .get(index)
                    .or_else(|| ports.first())
                    .copied()
                    .unwrap_or(5432);
                match host {
                    tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                    tokio_postgres::config::Host::Unix(dir) => {
                        format!("the socket in {} (port {port})", dir.display())
                    }
                }
            })
            .collect();
        if targets.is_empty() {
            "the default host".to_owned()
        } else {
            targets.join(", ")
        }
    }

    /// How the store's reads, creations and lease grants coalesced: each concurrent call
    /// waits for a free batch slot and is answered with every other call waiting then, in one
    /// statement (reads, creations) or one transaction (grants).
    pub fn batched_calls(&self) -> BatchedCalls {
        let (reads, read_statements) = self.reads.counts();
        let (creations, creation_statements) = self.creations.counts();
        let (leases, lease_transactions) = self.leases.counts();
        BatchedCalls {
            reads,
            read_statements,
            creations,
            creation_statements,
            leases,
            lease_transactions,
        }
    }

    /// How many lease holders of this process the store remembers: the live ones, and the
    /// gone ones some lease row still names (until then, their sessions pass on at once).
    /// Bounded by those: a long-lived process that starts runtime after runtime does not
    /// grow it.
    pub fn remembered_holders(&self) -> usize {
        self.book.remembered_holders()
    }

    /// Creates `header` with `events` and, with a holder, its first lease, in one statement
    /// with every creation waiting beside it (see [`creations`]).
    async fn write_creation(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: Option<LeaseHolder>,
    ) -> Result<Option<Lease>> {
        let id = header.id;
        header.validate()?;
        let first = header.first_stored_seq();
        check_contiguous(id, first, &events)?;
        let header_bytes = serde_json::to_vec(&header).map_err(|e| {
            SubagentError::new(ErrorCode::InvalidHeader, format!("session {id}: {e}"))
        })?;
        let encoded = encode_batch(id, &events)?;
        let first_seq = seq_column(first)?;
        let next_seq = seq_column(
            u64::try_from(events.len())
                .ok()
                .and_then(|len| first.checked_add(len))
                .unwrap_or(u64::MAX),
        )?;
        let holder_id = holder.as_ref().map(LeaseHolder::id);
        let terms = holder_id.map(|holder| self.book.lease_terms(holder, LeaseEpoch(1)));
        let created = self
            .creations
            .call(CreationRequest {
                id: uuid_of(id),
                parent: header.parent_session.map(uuid_of),
                header: header_bytes.into(),
                next_seq,
                epoch: i64::from(holder.is_some()),
                seed: encoded.map(Into::into),
                first_seq,
                holder: holder_id,
                row_ttl: terms.map_or(0.0, |terms| terms.row_ttl),
                incarnation: terms.and_then(|terms| terms.incarnation),
            })
            .await?;
        if !created {
            return Err(SubagentError::new(
                ErrorCode::SessionExists,
                format!("session {id} already exists"),
            ));
        }
        if let Some(holder) = &holder {
            self.book.remember(holder);
        }
        Ok(terms.map(|terms| terms.lease))
    }

    /// The bytes of `id`'s batch starting at `first_seq`, if one does.
    async fn stored_batch(
        &self,
        client: &tokio_postgres::Client,
        id: SessionId,
        first_seq: i64,
    ) -> Result<Option<Vec<u8>>> {
        let row = client
            .query_opt(
                "SELECT events FROM subagents_event_batches WHERE session = $1 AND first_seq = $2",
                &[&uuid_of(id), &first_seq],
            )
            .await
            .map_err(io(format!("reading session {id}")))?;
        Ok(row.map(|row| row.get(0)))
    }

    async fn listing(&self, parent: Option<SessionId>) -> Result<Vec<ListedSession>> {
        self.reconnecting("listing sessions", |_| self.listing_once(parent))
            .await
    }

    async fn listing_once(&self, parent: Option<SessionId>) -> Result<Vec<ListedSession>> {
        let client = self.client().await?;
        // A session with no events yet has nothing to list, as on the other stores.
        let rows = match parent {
            None => {
                let statement = client
                    .prepare_cached(
                        "SELECT id, header FROM subagents_sessions WHERE next_seq > 0 ORDER BY id",
                    )
                    .await
                    .map_err(io("listing sessions"))?;
                client.query(&statement, &[]).await
            }
            Some(parent) => {
                let statement = client
                    .prepare_cached(
                        "SELECT id, header FROM subagents_sessions
                         WHERE parent = $1 AND next_seq > 0 ORDER BY id",
                    )
                    .await
                    .map_err(io("listing sessions"))?;
                client.query(&statement, &[&uuid_of(parent)]).await
            }
        }
        .map_err(io("listing sessions"))?;
        Ok(rows
            .iter()
            .map(|row| {
                let id = SessionId::from_uuid(row.get(0));
                let bytes: Vec<u8> = row.get(1);
                match decode_header(id, &bytes) {
                    Ok(header) => ListedSession::Header(header),
                    Err(error) => ListedSession::Corrupt {
                        id: Some(id),
                        error,
                    },
                }
            })
            .collect())
    }
}

impl SessionPersistence for PostgresStore {
    fn create(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.write_creation(header, events, None).await.map(drop) })
    }

    fn create_leased(
        &self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
        holder: LeaseHolder,
    ) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(
            async move { super::granted(self.write_creation(header, events, Some(holder)).await?) },
        )
    }

    fn append(
        &self,
        id: SessionId,
        expected_next_seq: u64,
        events: Vec<Arc<SessionEvent>>,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            check_contiguous(id, expected_next_seq, &events)?;
            let Some(encoded) = encode_batch(id, &events)? else {
                return Ok(());
            };
            let count = u64::try_from(events.len()).unwrap_or(u64::MAX);
            let expected = seq_column(expected_next_seq)?;
            let next = seq_column(expected_next_seq.saturating_add(count))?;
            let epoch = lease
                .map(|LeaseEpoch(epoch)| seq_column(epoch))
                .transpose()?;
            let encoded = &encoded;
            self.reconnecting("appending", |attempt| async move {
                let client = self.client().await?;
                // One statement: the row lock, the compare, the batch and the head move together.
                // A leased write needs the latest epoch and a lease still live: a node paused
                // past its time-to-live may wake before it learns it was declared dead, and
                // before anyone took its sessions; what it would write then is an epoch its
                // parent already heard end. (The lease is read after the session row is
                // locked, which a takeover locks first; the clock is read then, not at the
                // statement's start.)
                let rows = client
                    .query(
                        &client
                            .prepare_cached(concat!(
                                "WITH head AS (
                         SELECT next_seq, epoch FROM subagents_sessions WHERE id = $1 FOR UPDATE
                     ), held AS (
                         SELECT ",
                                lease_live!("clock_timestamp()"),
                                " AS live FROM subagents_leases lease
                             LEFT JOIN subagents_nodes node ON node.node = lease.holder
                             WHERE lease.session = $1 AND lease.epoch = $3
                     ), fits AS (
                         SELECT 1 FROM head
                         WHERE next_seq = $2 AND ($3::bigint IS NULL
                             OR (epoch = $3 AND coalesce((SELECT live FROM held), false)))
                     ), batch AS (
                         INSERT INTO subagents_event_batches (session, first_seq, events)
                         SELECT $1, $2, $4 FROM fits
                         RETURNING 1
                     ), moved AS (
                         UPDATE subagents_sessions SET next_seq = $5
                         WHERE id = $1 AND EXISTS (SELECT 1 FROM fits)
                         RETURNING 1
                     )
                     SELECT next_seq, epoch, EXISTS (SELECT 1 FROM moved),
                         $3::bigint IS NULL OR coalesce((SELECT live FROM held), false)
                     FROM head",
                            ))
                            .await
                            .map_err(io("preparing a statement"))?,
                        &[&uuid_of(id), &expected, &epoch, &encoded, &next],
                    )
                    .await
                    .map_err(io(format!("appending to session {id}")))?;
                let Some(row) = rows.first() else {
                    return Err(not_found(id));
                };
                let (stored_next, stored_epoch, moved, live): (i64, i64, bool, bool) =
                    (row.get(0), row.get(1), row.get(2), row.get(3));
                if !moved {
                    // An earlier attempt whose answer was lost may have stored this very batch.
                    if attempt.after_loss
                        && stored_next == next
                        && (epoch.is_none() || epoch == Some(stored_epoch))
                        && self.stored_batch(&client, id, expected).await?.as_ref() == Some(encoded)
                    {
                        return Ok(());
                    }
                    check_append(
                        id,
                        expected_next_seq,
                        seq_value(stored_next)?,
                        lease,
                        seq_value(stored_epoch)?,
                    )?;
                    if !live {
                        return Err(lease_expired(id));
                    }
                    return Err(SubagentError::bug(format!(
                        "session {id}: an append that fits was not applied"
                    )));
                }
                Ok(())
            })
            .await
        })
    }

    fn flush(&self, id: SessionId) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.reconnecting("flushing", |_| async move {
                // Appends commit without waiting for the disk (the connections run with
                // synchronous_commit off). A transaction that writes and commits synchronously
                // flushes the write-ahead log up to its own commit, so every earlier append of
                // every session is durable once it returns.
                // One statement, its own transaction: the local setting holds at its commit. The
                // row is the connection's slot: a flush never waits on another connection's
                // unless their server processes share one.
                let client = self.client().await?;
                let touch = client
                    .prepare_cached(
                        "WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))
                     INSERT INTO subagents_flushes (slot, at)
                     SELECT pg_backend_pid() % $1, now() FROM durable
                     ON CONFLICT (slot) DO UPDATE SET at = excluded.at",
                    )
                    .await
                    .map_err(io(format!("flushing session {id}")))?;
                client
                    .execute(&touch, &[&FLUSH_SLOTS])
                    .await
                    .map_err(io(format!("flushing session {id}")))?;
                Ok(())
            })
            .await
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        Box::pin(self.listing(None))
    }

    fn list_children(&self, parent: SessionId) -> BoxFuture<'_, Result<Vec<ListedSession>>> {
        Box::pin(self.listing(Some(parent)))
    }

    fn header(&self, id: SessionId) -> BoxFuture<'_, Result<SessionHeader>> {
        Box::pin(async move { self.reads.call(ReadRequest::header(id)).await?.header() })
    }

    fn read_stored(
        &self,
        id: SessionId,
        from_seq: u64,
        before_seq: u64,
    ) -> BoxFuture<'_, Result<Vec<Arc<SessionEvent>>>> {
        Box::pin(async move {
            self.reads
                .call(ReadRequest::events(id, from_seq, before_seq))
                .await?
                .events()
        })
    }

    /// One read for the header and the stored log (two on the other stores); a seed stored by
    /// reference is resolved as [`SessionPersistence::read_from`] does.
    fn inspect(&self, id: SessionId) -> BoxFuture<'_, Result<StoredSession>> {
        Box::pin(async move {
            let stored = self
                .reads
                .call(ReadRequest::events(id, 0, u64::MAX).and_header())
                .await?;
            let header = stored.header()?;
            if header.first_stored_seq() > 0 {
                return super::inspection(self, id).await;
            }
            super::inspected(header, stored.events()?)
        })
    }

    fn acquire_lease(&self, id: SessionId, holder: LeaseHolder) -> BoxFuture<'_, Result<Lease>> {
        Box::pin(async move { self.leases.call(LeaseRequest { id, holder }).await })
    }

    fn renew_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.reconnecting("renewing a lease", |_| async move {
            let epoch = seq_column(epoch.0)?;
            let client = self.client().await?;
            let renewed = client
                .execute(
                    &client.prepare_cached("UPDATE subagents_leases SET expires_at = now() + make_interval(secs => $3)
                     WHERE session = $1 AND epoch = $2").await.map_err(io("preparing a statement"))?,
                    &[&uuid_of(id), &epoch, &self.lease_ttl.as_secs_f64()],
                )
                .await
                .map_err(io(format!("renewing the lease of session {id}")))?;
            if renewed == 0 {
                return Err(lease_lost(id));
            }
            Ok(())
            })
            .await
        })
    }

    fn release_lease(&self, id: SessionId, epoch: LeaseEpoch) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.reconnecting("releasing a lease", |_| async move {
                let epoch = seq_column(epoch.0)?;
                let client = self.client().await?;
                client
                    .execute(
                        &client
                            .prepare_cached(
                                "DELETE FROM subagents_leases WHERE session = $1 AND epoch = $2",
                            )
                            .await
                            .map_err(io("preparing a statement"))?,
                        &[&uuid_of(id), &epoch],
                    )
                    .await
                    .map_err(io(format!("releasing the lease of session {id}")))?;
                Ok(())
            })
            .await
        })
    }

    fn cache_get(&self, unit: &str, id: SessionId) -> BoxFuture<'_, Result<Option<Value>>> {
        let unit = unit.to_owned();
        Box::pin(async move {
            let unit = &unit;
            self.reconnecting("reading the projection cache", |_| async move {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    &client.prepare_cached("SELECT row FROM subagents_projection_cache WHERE unit = $1 AND session = $2").await.map_err(io("preparing a statement"))?,
                    &[&unit, &uuid_of(id)],
                )
                .await
                .map_err(io(format!("reading the {unit} cache of session {id}")))?;
            row.map(|row| {
                let bytes: Vec<u8> = row.get(0);
                decode_cache_row(unit, id, &bytes)
            })
            .transpose()
            })
            .await
        })
    }

    fn cache_put(
        &self,
        unit: &str,
        id: SessionId,
        row: Value,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        put_value_row(self, unit, id, &row, lease)
    }

    fn cache_put_encoded(
        &self,
        unit: &str,
        id: SessionId,
        row: EncodedRow,
        lease: Option<LeaseEpoch>,
    ) -> BoxFuture<'_, Result<()>> {
        let unit = unit.to_owned();
        Box::pin(async move {
            let bytes = row.into_bytes();
            let (unit, bytes) = (&unit, &bytes);
            self.reconnecting("writing the projection cache", |_| async move {
                let client = self.client().await?;
                let failed = || io(format!("writing the {unit} cache of session {id}"));
                let Some(LeaseEpoch(epoch)) = lease else {
                    client
                        .execute(
                            &client
                                .prepare_cached(
                                    "INSERT INTO subagents_projection_cache (unit, session, row)
                         VALUES ($1, $2, $3)
                         ON CONFLICT (unit, session) DO UPDATE SET row = excluded.row",
                                )
                                .await
                                .map_err(io("preparing a statement"))?,
                            &[&unit, &uuid_of(id), &bytes],
                        )
                        .await
                        .map_err(failed())?;
                    return Ok(());
                };
                // The session row is locked in share mode: a lease taken meanwhile (which moves the
                // epoch under `FOR UPDATE`) either waits for this write or fences it out.
                let written = client
                    .execute(
                        &client
                            .prepare_cached(
                                "WITH fence AS (
                                 SELECT id FROM subagents_sessions
                                 WHERE id = $2 AND epoch = $4 FOR SHARE
                             )
                             INSERT INTO subagents_projection_cache (unit, session, row)
                             SELECT $1, id, $3 FROM fence
                             ON CONFLICT (unit, session) DO UPDATE SET row = excluded.row",
                            )
                            .await
                            .map_err(io("preparing a statement"))?,
                        &[&unit, &uuid_of(id), &bytes, &seq_column(epoch)?],
                    )
                    .await
                    .map_err(failed())?;
                if written == 0 {
                    return Err(lease_lost(id));
                }
                Ok(())
            })
            .await
        })
    }
}
