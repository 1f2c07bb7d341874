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
//! Compare-and-append is one statement (shared by the appends to other sessions waiting with
//! it): it locks the session row, checks the expected seq and the writer's epoch, inserts the
//! batch and moves the head together, so two writers never interleave and a fenced-out writer
//! changes nothing (`LEASE_LOST`, as on sled). The
//! connections run with `synchronous_commit=off`: a commit is visible to every reader when it
//! returns, and reaches the disk within the server's WAL writer delay (three times
//! `wal_writer_delay` at worst, 600 ms by default); a server crash in that window loses it.
//! `flush` commits synchronously, which makes every earlier commit durable; flushes asked while
//! one is in flight share the next (group commit). Leases expire after
//! their time-to-live unless renewed; a holder of this process that is gone (its runtime
//! dropped) holds nothing, as on the embedded stores. A holder that joined the cluster as a
//! node ([`PostgresStore::join`]) renews nothing: its leases live while its node heartbeats.
//!
//! # Schema
//! The crate creates and migrates its tables itself, at [`PostgresStore::connect`], under an
//! advisory lock, so any number of runtimes may start against one database at once. A process
//! waits for another's migration at most the statement timeout (`STORE_IO` past it), so one
//! stopped while migrating holds no other `connect` forever (see `schema`).
//!
//! [`SessionPersistence`]: super::SessionPersistence

mod appends;
mod batch;
mod cache_puts;
mod config;
mod creations;
pub mod deliveries;
mod lease_book;
mod leases;
mod membership;
mod persistence;
mod pool;
mod reads;
mod reconnect;
mod schema;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::future::{BoxFuture, FutureExt};

use super::codec::{decode_header, encode_batch};
use super::group_flush::GroupFlush;
use super::lease::{Lease, LeaseEpoch, LeaseHolder};
use super::{check_contiguous, ListedSession};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{SessionEvent, SessionHeader};

use appends::AppendRequest;
use batch::Batcher;
use cache_puts::CachePutRequest;
use creations::CreationRequest;
use lease_book::LeaseBook;
use leases::{Granted, LeaseRequest};
use pool::{checkout, open_pool, Pooled, CONNECT_TIMEOUT};
use reads::{ReadRequest, StoredRows};
use reconnect::reconnecting;
use schema::{known_version, schema_version};

pub use config::PostgresConfig;
pub use membership::{LeasedChild, NodeIncarnation, NodeMembership};
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

/// The fewest remembered lease holders at which gone ones are swept.
const HOLDERS_SWEPT_FROM: usize = 64;

/// How many rows `flush` writes in turn: each connection touches the one its server process
/// id picks, so the table stays this small and concurrent flushes rarely share a row.
const FLUSH_SLOTS: i32 = 256;

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

/// How many batches of appends run at once, each on a connection of the store's pool.
const APPEND_SLOTS: usize = 4;

/// How many batches of projection-cache writes run at once, each on a connection of the
/// store's pool.
const CACHE_PUT_SLOTS: usize = 2;

/// A batch's answers: each call's own, or the batch's failure for every call.
fn each_or_all<T>(answered: Result<Vec<Result<T>>>, calls: usize) -> Vec<Result<T>> {
    match answered {
        Ok(answers) => answers,
        Err(error) => (0..calls).map(|_| Err(error.clone())).collect(),
    }
}

/// One batch's statement (or transaction) over its calls, on a connection of `Ctx`'s: each
/// call's answer in order, or the statement's failure.
type BatchRun<Ctx, Req, Resp> =
    for<'a> fn(&'a Ctx, &'a [Req], reconnect::Attempt) -> BoxFuture<'a, Result<Vec<Result<Resp>>>>;

/// Starts a [`Batcher`] of `slots` whose batches run `run` with `ctx` (its connections), each
/// within `deadline` and tried again on a lost connection (see [`reconnecting`]; `what` names
/// it in errors); a batch that fails answers each of its calls with its failure.
fn batcher<Ctx, Req, Resp>(
    runtime: &tokio::runtime::Handle,
    slots: usize,
    (what, deadline): (&'static str, Duration),
    ctx: Ctx,
    run: BatchRun<Ctx, Req, Resp>,
) -> Batcher<Req, Resp>
where
    Ctx: Clone + Send + Sync + 'static,
    Req: Clone + Send + Sync + 'static,
    Resp: Send + 'static,
{
    Batcher::start(runtime, slots, move |requests: Vec<Req>| {
        let ctx = ctx.clone();
        async move {
            let answered =
                reconnecting(what, deadline, |attempt| run(&ctx, &requests, attempt)).await;
            each_or_all(answered, requests.len())
        }
    })
}

/// How much longer than its statements' server-side timeout a store call waits for an
/// answer: the server's own cancellation (an error that names it) usually answers first.
const CALL_GRACE: Duration = Duration::from_secs(1);

/// How a [`PostgresStore`]'s appends, projection-cache writes, reads, creations, lease grants and releases, and flushes
/// coalesced, since it opened ([`PostgresStore::batched_calls`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchedCalls {
    /// Compare-and-appends asked for.
    pub appends: u64,
    /// The statements that answered them.
    pub append_statements: u64,
    /// Projection-cache writes asked for.
    pub cache_puts: u64,
    /// The statements that answered them.
    pub cache_put_statements: u64,
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
    /// Lease releases asked for.
    pub releases: u64,
    /// The statements that answered them.
    pub release_statements: u64,
    /// Durability flushes asked for ([`SessionPersistence::flush`]).
    ///
    /// [`SessionPersistence::flush`]: super::SessionPersistence::flush
    pub flushes: u64,
    /// The synchronous commits that answered them.
    pub flush_commits: u64,
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

/// `timeout` in milliseconds as a server setting takes it: from 1 to `i32::MAX` (0 would turn
/// the timeout off).
///
/// # Errors
/// `INVALID_CONFIG` naming `what` for a duration out of that range.
fn server_millis(what: &str, timeout: Duration) -> Result<i32> {
    match i32::try_from(timeout.as_millis()) {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(SubagentError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the PostgreSQL {what} must be from 1 ms to {} ms, not {timeout:?}",
                i32::MAX
            ),
        )),
    }
}

/// [`SessionPersistence`](super::SessionPersistence) over PostgreSQL (see the module docs).
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
    /// The longest a schema migration runs once it holds the schema's lock
    /// ([`PostgresConfig::migration_timeout`]).
    migration_timeout: Duration,
    /// The lease holders of this process, shared with the lease batches.
    book: Arc<LeaseBook>,
    /// Compare-and-appends, batched (see [`appends`]).
    appends: Batcher<AppendRequest, ()>,
    /// Projection-cache writes, batched (see [`cache_puts`]).
    cache_puts: Batcher<CachePutRequest, ()>,
    /// Header and log reads, batched (see [`batch`]).
    reads: Batcher<ReadRequest, StoredRows>,
    /// Session creations, batched (see [`batch`]): `true` for each one created.
    creations: Batcher<CreationRequest, bool>,
    /// Lease grants, batched (see [`batch`]).
    leases: Batcher<LeaseRequest, Granted>,
    /// Lease releases, batched (see [`batch`]).
    releases: Batcher<(SessionId, LeaseEpoch), ()>,
    /// Durability flushes: one synchronous commit at a time, shared by every flush it covers.
    flushes: GroupFlush,
    /// Flushes asked for, and the synchronous commits run for them.
    flush_counts: Arc<FlushCounts>,
}

/// What [`PostgresStore::batched_calls`] reports of flushes.
#[derive(Debug, Default)]
struct FlushCounts {
    asked: AtomicU64,
    commits: AtomicU64,
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

/// A connection from `pool`, or `STORE_IO` naming where the store connects (`target`, asked
/// for only on failure: every append takes a connection).
async fn connection(pool: &Pool, target: impl FnOnce() -> String) -> Result<Pooled> {
    checkout(pool).await.map_err(|error| {
        SubagentError::store_io(format!("connecting to PostgreSQL at {}", target()), error)
    })
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
        // Bounded throughout: the wait for the schema's lock and every statement (see there).
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
        let timeout_ms = server_millis("statement timeout", config.statement_timeout)?;
        server_millis("migration timeout", config.migration_timeout)?;
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
        // The batches' own connections: a burst of reads, creations, grants and releases never
        // queues behind the appends, and each slot answers every call waiting when it frees.
        let lane = open_pool(&pg, &runtime, 4 * BATCH_SLOTS)?;
        let book = Arc::new(LeaseBook::new(config.lease_ttl, config.node_ttl));
        // Each batch is tried again on a lost connection (see `reconnect`), and its failure
        // answers each of its calls. An append whose commit was lost finds its own batch
        // stored, a creation its own header (see there); deleting a lease row or writing a
        // cache row twice does it once; a grant whose commit was lost is granted again, each
        // holder then getting a newer epoch (its own lease), which fences nothing live.
        let appends = batcher(
            &runtime,
            APPEND_SLOTS,
            ("appending", call_deadline),
            pool.clone(),
            |pool, requests, attempt| appends::append_many(pool, requests, attempt).boxed(),
        );
        let cache_puts = batcher(
            &runtime,
            CACHE_PUT_SLOTS,
            ("writing the projection cache", call_deadline),
            pool.clone(),
            |pool, requests, _| cache_puts::put_many(pool, requests).boxed(),
        );
        let reads = batcher(
            &runtime,
            BATCH_SLOTS,
            ("reading sessions", call_deadline),
            lane.clone(),
            |lane, requests, _| reads::read_many(lane, requests).boxed(),
        );
        let with_book = (lane.clone(), Arc::clone(&book));
        let creations = batcher(
            &runtime,
            BATCH_SLOTS,
            ("creating sessions", call_deadline),
            with_book.clone(),
            |(lane, book), requests, attempt| {
                creations::create_many(lane, book, requests, attempt).boxed()
            },
        );
        let releases = batcher(
            &runtime,
            BATCH_SLOTS,
            ("releasing leases", call_deadline),
            lane,
            |lane, released: &[(SessionId, LeaseEpoch)], _| {
                leases::release_many(lane, released).boxed()
            },
        );
        let leases = batcher(
            &runtime,
            BATCH_SLOTS,
            ("leasing sessions", call_deadline),
            with_book,
            |(lane, book), requests, _| leases::grant_many(lane, book, requests).boxed(),
        );
        let store = Self {
            pool,
            pg_config: pg,
            lease_ttl: config.lease_ttl,
            node_ttl: config.node_ttl,
            delivery_retention: config.delivery_retention,
            dead_node_retention: config.dead_node_retention,
            delivery_deadline: config.delivery_deadline,
            call_deadline,
            migration_timeout: config.migration_timeout,
            book,
            appends,
            cache_puts,
            reads,
            creations,
            leases,
            releases,
            flushes: GroupFlush::default(),
            flush_counts: Arc::default(),
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

    async fn client(&self) -> Result<Pooled> {
        // The pool's timeouts run on tokio: outside a runtime they would panic.
        store_runtime()?;
        connection(&self.pool, || self.target()).await
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

    /// How the store's reads, creations, lease grants and releases, and flushes coalesced:
    /// each concurrent call waits for a free batch slot and is answered with every other call
    /// waiting then, in one statement (reads, creations, releases) or one transaction
    /// (grants); a flush waits for the one synchronous commit in flight and shares the next
    /// with every flush asked meanwhile.
    pub fn batched_calls(&self) -> BatchedCalls {
        let (appends, append_statements) = self.appends.counts();
        let (cache_puts, cache_put_statements) = self.cache_puts.counts();
        let (reads, read_statements) = self.reads.counts();
        let (creations, creation_statements) = self.creations.counts();
        let (leases, lease_transactions) = self.leases.counts();
        let (releases, release_statements) = self.releases.counts();
        BatchedCalls {
            appends,
            append_statements,
            cache_puts,
            cache_put_statements,
            reads,
            read_statements,
            creations,
            creation_statements,
            leases,
            lease_transactions,
            releases,
            release_statements,
            flushes: self.flush_counts.asked.load(Ordering::Relaxed),
            flush_commits: self.flush_counts.commits.load(Ordering::Relaxed),
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
