//! Provides [`PostgresConfig`]: how a [`PostgresStore`](super::PostgresStore) connects.

use std::time::Duration;

/// How a [`PostgresStore`](super::PostgresStore) connects.
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
    /// cross-node ask waits longer for its answer. Sending it, and on expiry withdrawing it or
    /// reading its answer, are store calls around that wait, each under the store's call
    /// deadline (see `statement_timeout`). On expiry a delivery not yet taken is withdrawn, and
    /// the sender gets `NODE_UNRESPONSIVE`.
    pub delivery_deadline: Duration,
    /// The longest a statement runs on the server (the connections' `statement_timeout`,
    /// default 60 s, from 1 ms to `i32::MAX` ms) and, a second later, the longest each
    /// attempt of a store call waits for the server's answer (a call tried again after a lost
    /// connection waits at most [`RECONNECT_WITHIN`] more): a server that stops answering
    /// without closing the connection (paused, partitioned, stuck on its disk) fails the call
    /// with `STORE_IO` instead of holding its caller forever. A call that timed out may still
    /// have committed: an append's log faults, as on any failed write, and a resume reads what
    /// the store holds; a lease granted unseen passes on as any lease does. A connection whose
    /// call timed out is closed, not handed to the next call, which would wait behind the
    /// statement still in flight. A schema migration's wait for another process's migration
    /// has this deadline too (`STORE_IO` naming that migration); its own statements have
    /// `migration_timeout`. Raise it for logs so long that reading one whole takes longer.
    ///
    /// [`RECONNECT_WITHIN`]: super::RECONNECT_WITHIN
    pub statement_timeout: Duration,
    /// The longest a schema migration runs once it holds the schema's lock (default 10
    /// minutes, from 1 ms to `i32::MAX` ms): each of its statements on the server, and all of
    /// them together, a second later, at the client. A migration that does not finish in time
    /// (a server that stopped answering, DDL stuck behind a table's users) fails `connect` with
    /// `STORE_IO` and applies nothing: its transaction is rolled back and its connection
    /// closed. A migrating process that stops answering itself holds the schema's locks no
    /// longer than the call deadline (`statement_timeout` and a second): the server ends its
    /// transaction once it has been idle in it that long.
    pub migration_timeout: Duration,
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
            .field("migration_timeout", &self.migration_timeout)
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
            migration_timeout: Duration::from_secs(600),
        }
    }
}
