//! Provides [`NodeMembership`]: a runtime's place in a cluster of runtimes that share one
//! PostgreSQL, kept by heartbeats on its row of `subagents_nodes`.
//!
//! # Why nodes
//! A lease taken by a member ([`PostgresStore::join`]) lives as long as its node heartbeats, so
//! a node renews one row instead of one lease per live session. A node that stops heartbeating
//! (it died, or it is paused) holds its leases no longer than the node time-to-live; another
//! node then takes them with newer fencing epochs, and anything the silent node writes after
//! that is refused (`LEASE_LOST`).
//!
//! # A lost membership
//! A node whose row expired is not revived by a late heartbeat: it has been declared dead, and
//! another node may hold its sessions. Its membership reports the loss
//! ([`NodeMembership::lost`]), and its holder's later leases are plain ones again (with a
//! time-to-live to renew). A host should stop such a runtime.
//!
//! # Incarnations
//! Each process that joins under a node id is a new incarnation of the node
//! ([`NodeMembership::incarnation`]), written in the node's row and in every lease it takes. A
//! member's lease is live only while its own incarnation's row is, so a process restarted
//! under the id of one that died (its row expired or not) fences its predecessor's leases the
//! moment it joins, and a predecessor that was only paused finds the row another
//! incarnation's at its next heartbeat, and is lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::deliveries::{listen, Inbound};
use super::{io, PostgresStore};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::store::LeaseHolder;

/// A node's membership: its row, renewed every third of the node time-to-live until it is
/// left, dropped, or lost.
#[derive(Debug)]
pub struct NodeMembership {
    pub(super) node: uuid::Uuid,
    /// This process's incarnation of the node: a new one at each join.
    pub(super) incarnation: uuid::Uuid,
    lost: CancellationToken,
    /// Stops the heartbeat, the listener and the server when the membership is dropped or
    /// left.
    pub(super) stop: CancellationToken,
    pub(super) store: Arc<PostgresStore>,
    pub(super) inbound: Arc<Inbound>,
}

impl NodeMembership {
    /// The node's id: the id of the [`LeaseHolder`] that joined.
    pub fn node(&self) -> uuid::Uuid {
        self.node
    }

    /// This process's incarnation of the node, new at each join: the node's leases and the
    /// deliveries it claims carry it, so a process that joins again under the node's id
    /// (a restart) fences everything its predecessor held at once.
    pub fn incarnation(&self) -> uuid::Uuid {
        self.incarnation
    }

    /// Cancelled once the membership is lost: the node's row expired before a heartbeat
    /// renewed it (the node was paused, or could not reach the server for a time-to-live).
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// How long a node keeps its row, and with it its leases, without a heartbeat: a node
    /// that stopped holds nothing longer than this.
    pub fn node_ttl(&self) -> Duration {
        self.store.node_ttl
    }

    /// Leaves the cluster: the heartbeat stops and the node's row is removed. Leases the node
    /// still holds then last only their own time-to-live: release the runtime's agents first.
    /// A lost membership's row stays: it is the record that the node was declared dead (for
    /// `PostgresConfig::dead_node_retention`), and this process cannot join under its holder
    /// again.
    ///
    /// # Errors
    /// `STORE_IO` when the row cannot be removed within the store's call deadline (it then
    /// expires on its own): a server that stops answering does not hold a node's shutdown.
    pub async fn leave(&self) -> Result<()> {
        self.stop.cancel();
        self.store.book.forget_member(self.node);
        // Removing this incarnation's row again removes nothing more: tried again as is.
        self.store
            .reconnecting("leaving the cluster", |_| async {
                self.store
                    .client()
                    .await?
                    .execute(
                        "DELETE FROM subagents_nodes
                         WHERE node = $1 AND incarnation = $2 AND expires_at > now()",
                        &[&self.node, &self.incarnation],
                    )
                    .await
                    .map_err(io("leaving the cluster"))?;
                Ok(())
            })
            .await
    }
}

impl NodeMembership {
    /// The node (and its incarnation) whose live lease holds `session` now, if any: a node's
    /// lease is live while the incarnation that took it has a live row, any other while its
    /// own expiry is ahead. A cluster routes what a child is asked to the node that holds it, and checks
    /// a sender's authority over a parent by who holds the parent.
    ///
    /// # Errors
    /// `STORE_IO`.
    pub async fn holder_of(
        &self,
        session: crate::ids::SessionId,
    ) -> Result<Option<NodeIncarnation>> {
        self.store
            .reconnecting("reading who holds a session", |_| {
                self.holder_of_once(session)
            })
            .await
    }

    async fn holder_of_once(
        &self,
        session: crate::ids::SessionId,
    ) -> Result<Option<NodeIncarnation>> {
        let client = self.store.client().await?;
        let row = client
            .query_opt(
                &client
                    .prepare_cached(concat!(
                        "SELECT lease.holder, lease.incarnation FROM subagents_leases lease
                             LEFT JOIN subagents_nodes node ON node.node = lease.holder
                             WHERE lease.session = $1 AND ",
                        super::lease_live!()
                    ))
                    .await
                    .map_err(io("preparing a statement"))?,
                &[&super::uuid_of(session)],
            )
            .await
            .map_err(io(format!("reading who holds session {session}")))?;
        Ok(row
            .map(|row| NodeIncarnation {
                node: row.get(0),
                incarnation: row.get(1),
            })
            .filter(|holder| !self.store.book.is_gone(holder.node)))
    }
}

/// A child's lease, as [`NodeMembership::leased_children`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasedChild {
    /// The child's session.
    pub child: crate::ids::SessionId,
    /// The node (and incarnation) that took the lease.
    pub holder: NodeIncarnation,
    /// Whether the lease is live: its holder is still that incarnation of a live node. A dead
    /// lease was never released: its holder stopped (or was restarted under its id) with the
    /// child resident there.
    pub live: bool,
}

impl NodeMembership {
    /// The children of `parent` with a lease, live or left by a holder that stopped: a
    /// restarted parent's node finds the children its predecessor placed on other nodes, or
    /// ran itself, and those a node that stopped left behind.
    ///
    /// # Errors
    /// `STORE_IO`.
    pub async fn leased_children(&self, parent: crate::ids::SessionId) -> Result<Vec<LeasedChild>> {
        self.store
            .reconnecting("reading which children are leased", |_| {
                self.leased_children_once(parent)
            })
            .await
    }

    async fn leased_children_once(
        &self,
        parent: crate::ids::SessionId,
    ) -> Result<Vec<LeasedChild>> {
        let client = self.store.client().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(concat!(
                        "SELECT lease.session, lease.holder, lease.incarnation, ",
                        super::lease_live!(),
                        " FROM subagents_sessions session
                             JOIN subagents_leases lease ON lease.session = session.id
                             LEFT JOIN subagents_nodes node ON node.node = lease.holder
                             WHERE session.parent = $1",
                    ))
                    .await
                    .map_err(io("preparing a statement"))?,
                &[&super::uuid_of(parent)],
            )
            .await
            .map_err(io(format!("reading which children of {parent} are leased")))?;
        Ok(rows
            .iter()
            .map(|row| {
                let holder = NodeIncarnation {
                    node: row.get(1),
                    incarnation: row.get(2),
                };
                LeasedChild {
                    child: crate::ids::SessionId::from_uuid(row.get(0)),
                    holder,
                    live: row.get::<_, bool>(3) && !self.store.book.is_gone(holder.node),
                }
            })
            .collect())
    }
}

impl NodeMembership {
    /// The live incarnations of `nodes` now (those whose rows have not expired).
    ///
    /// # Errors
    /// `STORE_IO`.
    pub async fn live_among(&self, nodes: &[uuid::Uuid]) -> Result<Vec<NodeIncarnation>> {
        self.store
            .reconnecting("reading which nodes are live", |_| {
                self.live_among_once(nodes)
            })
            .await
    }

    /// Whether `node` is a live member now: `None` when no node of that id is a member at all
    /// (none joined under it, or it stopped long enough ago to be pruned), `Some(false)` when
    /// it stopped or left.
    ///
    /// # Errors
    /// `STORE_IO`.
    pub async fn is_live(&self, node: uuid::Uuid) -> Result<Option<bool>> {
        self.store
            .reconnecting("reading whether a node is live", |_| async move {
                let client = self.store.client().await?;
                let row = client
                    .query_opt(
                        &client
                            .prepare_cached(
                                "SELECT expires_at > now() FROM subagents_nodes WHERE node = $1",
                            )
                            .await
                            .map_err(io("preparing a statement"))?,
                        &[&node],
                    )
                    .await
                    .map_err(io("reading whether a node is live"))?;
                Ok(row.map(|row| row.get(0)))
            })
            .await
    }

    async fn live_among_once(&self, nodes: &[uuid::Uuid]) -> Result<Vec<NodeIncarnation>> {
        let client = self.store.client().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT node, incarnation FROM subagents_nodes
                         WHERE node = ANY($1) AND expires_at > now()",
                    )
                    .await
                    .map_err(io("preparing a statement"))?,
                &[&nodes],
            )
            .await
            .map_err(io("reading which nodes are live"))?;
        Ok(rows
            .iter()
            .map(|row| NodeIncarnation {
                node: row.get(0),
                incarnation: row.get(1),
            })
            .collect())
    }
}

/// One process's run of a node: the node's id and the incarnation that joined under it
/// (`None` for what a store of schema 6 or older wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeIncarnation {
    /// The node's id.
    pub node: uuid::Uuid,
    /// The incarnation: a new one each time a process joins under the node's id.
    pub incarnation: Option<uuid::Uuid>,
}

impl NodeIncarnation {
    /// Whether this and `other` may be the same process: the same node, and the same
    /// incarnation unless either is unknown (written by a node of an older schema, or not
    /// learnt yet).
    pub fn may_be(&self, other: &NodeIncarnation) -> bool {
        self.node == other.node
            && (self.incarnation.is_none()
                || other.incarnation.is_none()
                || self.incarnation == other.incarnation)
    }
}

impl NodeMembership {
    /// Stops heartbeating and serving without removing the row: the node's leases then expire
    /// as a dead node's would. Idempotent; a membership left already stays left.
    pub(crate) fn go_silent(&self) {
        self.stop.cancel();
        self.store.book.forget_member(self.node);
    }
}

impl Drop for NodeMembership {
    /// Stops heartbeating and serving without removing the row: the node's leases then expire
    /// as a dead node's would.
    fn drop(&mut self) {
        self.go_silent();
    }
}

impl PostgresStore {
    /// Joins `holder`'s runtime to the cluster as a node named `name`, and heartbeats its row
    /// until the membership is left or dropped. Leases `holder` takes from then on live as long
    /// as the node heartbeats (they carry no time-to-live to renew). The node listens for
    /// deliveries from its peers from now on (see [`NodeMembership::serve`]).
    ///
    /// # Errors
    /// `LEASE_LOST` when `holder`'s node was declared dead while this process ran it;
    /// `SESSION_LEASED` when another process runs `holder`'s node (its row heartbeats while the
    /// join watches for half a node time-to-live; a row nothing renews, of a process that died,
    /// is taken over as a new incarnation, as is an expired one);
    /// `STORE_IO` when the row cannot be written; `NO_ACTOR_SYSTEM` outside a tokio runtime.
    pub async fn join(
        self: &Arc<Self>,
        holder: &LeaseHolder,
        name: &str,
    ) -> Result<NodeMembership> {
        let node = holder.id();
        if self.book.was_lost(node) {
            return Err(Joining::Dead.refusal(node));
        }
        let ttl = self.node_ttl.as_secs_f64();
        // Listening first: a failure here leaves no row behind (a row left to expire would be
        // the record of a dead node, and the holder could never join).
        let inbound = Arc::new(Inbound::default());
        let stop = CancellationToken::new();
        listen(self, node, Arc::clone(&inbound), stop.clone()).await?;
        let incarnation = uuid::Uuid::now_v7();
        // Its statements' deadline, and the half time-to-live it waits to see a live node beat.
        let inserted = super::reconnect::within(
            "joining the cluster",
            self.call_deadline.saturating_add(self.node_ttl / 2),
            self.insert_member(node, name, ttl, incarnation),
        );
        let written = match inserted.await {
            Ok(Joining::Joined(written)) => written,
            Ok(refused) => {
                stop.cancel();
                return Err(refused.refusal(node));
            }
            Err(error) => {
                stop.cancel();
                return Err(error);
            }
        };
        self.book.remember(holder);
        self.book.remember_member(node, incarnation);
        let membership = NodeMembership {
            node,
            incarnation,
            lost: CancellationToken::new(),
            stop,
            store: Arc::clone(self),
            inbound,
        };
        let heartbeat = Heartbeat {
            store: Arc::clone(self),
            node,
            incarnation,
            lost: membership.lost.clone(),
            stop: membership.stop.clone(),
            client: None,
        };
        tokio::spawn(heartbeat.run(written + self.node_ttl));
        tracing::info!(%node, %incarnation, name, "joined the cluster");
        Ok(membership)
    }

    /// Removes the rows of nodes declared dead more than `dead_node_retention` ago (whichever
    /// node prunes: any serving node prunes for all).
    pub(super) async fn prune_dead_nodes(&self) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM subagents_nodes
                 WHERE expires_at < now() - make_interval(secs => $1)",
                &[&self.dead_node_retention.as_secs_f64()],
            )
            .await
            .map_err(io("pruning dead nodes' rows"))?;
        Ok(())
    }

    /// Writes `node`'s row. A row already there is a live process of this id (refused: it
    /// heartbeats while this watches for half a time-to-live), or one that died, declared dead
    /// already or not yet (taken over by `incarnation`: what the dead incarnation held passes
    /// on at once, and were it only paused, it finds the row another incarnation's at its next
    /// heartbeat).
    async fn insert_member(
        &self,
        node: uuid::Uuid,
        name: &str,
        ttl: f64,
        incarnation: uuid::Uuid,
    ) -> Result<Joining> {
        let client = self.client().await?;
        // A new node, or one declared dead: its row is written at once.
        let first = self.claim_row(&client, node, name, ttl, incarnation, None);
        if let joined @ Joining::Joined(_) = first.await? {
            return Ok(joined);
        }
        let seen = client
            .query_opt(
                "SELECT heartbeat_at::text FROM subagents_nodes WHERE node = $1",
                &[&node],
            )
            .await
            .map_err(io(format!("joining the cluster as node {node}")))?
            .map(|row| row.get::<_, String>(0));
        // A live node beats every third of its time-to-live: half of it shows one.
        tokio::time::sleep(self.node_ttl / 2).await;
        self.claim_row(&client, node, name, ttl, incarnation, seen.as_deref())
            .await
    }

    /// Writes `node`'s row as `incarnation`'s, in one statement that decides whose it is: a
    /// missing row is inserted, and an expired one, or one whose heartbeat is still `seen`
    /// (nothing renewed it while the join watched), is taken over. `Live` when the row was
    /// renewed meanwhile and has not expired (another process runs the node). One statement,
    /// because a row read live and then written could expire between the two, and a process
    /// that died would then be taken for a live one.
    async fn claim_row(
        &self,
        client: &tokio_postgres::Client,
        node: uuid::Uuid,
        name: &str,
        ttl: f64,
        incarnation: uuid::Uuid,
        seen: Option<&str>,
    ) -> Result<Joining> {
        // Taken before each write, so this node never thinks its row lives longer than the
        // server does.
        let written = Instant::now();
        let claimed = client
            .execute(
                "INSERT INTO subagents_nodes (node, name, expires_at, incarnation)
                 VALUES ($1, $2, now() + make_interval(secs => $3), $4)
                 ON CONFLICT (node) DO UPDATE
                 SET name = EXCLUDED.name, heartbeat_at = now(), started_at = now(),
                     expires_at = EXCLUDED.expires_at, incarnation = EXCLUDED.incarnation
                 WHERE subagents_nodes.expires_at <= now()
                    OR subagents_nodes.heartbeat_at::text = $5::text",
                &[&node, &name, &ttl, &incarnation, &seen],
            )
            .await
            .map_err(io(format!("joining the cluster as node {node}")))?;
        Ok(if claimed == 1 {
            Joining::Joined(written)
        } else {
            Joining::Live
        })
    }
}

/// How a join found its node's row.
enum Joining {
    /// Written (or taken over from a process that died), at this instant or later.
    Joined(Instant),
    /// Declared dead while this process ran it: the process must join under a new holder.
    Dead,
    /// Heartbeating: another process runs this node.
    Live,
}

impl Joining {
    fn refusal(&self, node: uuid::Uuid) -> SubagentError {
        match self {
            Self::Live => SubagentError::new(
                ErrorCode::SessionLeased,
                format!(
                    "node {node} is live in another process (it heartbeats): a second process \
                     cannot join under its id"
                ),
            ),
            Self::Joined(_) | Self::Dead => SubagentError::new(
                ErrorCode::LeaseLost,
                format!(
                    "node {node} was declared dead while this process ran it: a new runtime \
                     (a new holder) must join"
                ),
            ),
        }
    }
}

/// The first wait before a failed heartbeat is tried again; it doubles up to
/// [`HEARTBEAT_RETRY_MAX`] (or the heartbeat period, when shorter).
const HEARTBEAT_RETRY: Duration = Duration::from_millis(50);

/// The longest wait between two attempts of a failing heartbeat: short, so that a beat lands
/// soon after the server is back, however long it was away (the row may be close to expiring).
const HEARTBEAT_RETRY_MAX: Duration = Duration::from_millis(250);

/// The task that renews a node's row, on a connection of its own: a pool busy with the
/// runtime's writes must not starve the heartbeat into the node's death.
struct Heartbeat {
    store: Arc<PostgresStore>,
    node: uuid::Uuid,
    incarnation: uuid::Uuid,
    lost: CancellationToken,
    stop: CancellationToken,
    /// Opened at the first beat, and again after a beat failed.
    client: Option<tokio_postgres::Client>,
}

impl Heartbeat {
    /// Beats until stopped or lost; the row is good until `good_until`, as far as this node
    /// knows.
    async fn run(mut self, mut good_until: Instant) {
        let ttl = self.store.node_ttl;
        let every = (ttl / 3).max(Duration::from_millis(1));
        // After a failed beat the next comes sooner (a server restarting is back within a
        // second or two): a beat a whole period later could land after the row expired.
        let mut wait = every;
        let mut retry = HEARTBEAT_RETRY;
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let sent = Instant::now();
            // A beat that has not landed by the time the row expires is a lost membership,
            // however long the server or the network would keep it waiting.
            let beat = match tokio::time::timeout_at(good_until, self.beat()).await {
                Ok(beat) => beat,
                Err(_) => Err(SubagentError::new(
                    ErrorCode::StoreIo,
                    format!(
                        "heartbeating node {}: no answer within the node time-to-live",
                        self.node
                    ),
                )),
            };
            match beat {
                Ok(true) => {
                    good_until = sent + ttl;
                    (wait, retry) = (every, HEARTBEAT_RETRY);
                }
                Ok(false) => {
                    tracing::error!(node = %self.node, "this node's membership expired, or another process joined under its id: another node may hold its sessions");
                    break;
                }
                Err(error) => {
                    // The connection may be gone: the next beat opens another.
                    self.client = None;
                    tracing::warn!(node = %self.node, %error, "a heartbeat failed; retrying");
                    if Instant::now() >= good_until {
                        tracing::error!(node = %self.node, "no heartbeat landed for a node time-to-live: this node's membership is lost");
                        break;
                    }
                    wait = retry.min(every);
                    retry = (retry * 2).min(HEARTBEAT_RETRY_MAX);
                }
            }
        }
        self.store.book.forget_member(self.node);
        self.store.book.remember_lost(self.node);
        self.lost.cancel();
        // A node declared dead serves nothing more: its sessions may be another node's now.
        self.stop.cancel();
    }

    /// Renews the row if it has not expired and is still this incarnation's; `false` when it
    /// has expired, is gone, or another process joined under the node's id.
    async fn beat(&mut self) -> Result<bool> {
        let client = match &mut self.client {
            Some(client) => client,
            empty => {
                let (client, connection) = self
                    .store
                    .pg_config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(io("opening the heartbeat connection"))?;
                // Driven until the client is dropped (the heartbeat ended or gave it up).
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "the heartbeat connection closed");
                    }
                });
                empty.insert(client)
            }
        };
        let renewed = client
            .execute(
                "UPDATE subagents_nodes
                 SET heartbeat_at = now(), expires_at = now() + make_interval(secs => $2)
                 WHERE node = $1 AND incarnation = $3 AND expires_at > now()",
                &[
                    &self.node,
                    &self.store.node_ttl.as_secs_f64(),
                    &self.incarnation,
                ],
            )
            .await
            .map_err(io(format!("heartbeating node {}", self.node)))?;
        Ok(renewed == 1)
    }
}
