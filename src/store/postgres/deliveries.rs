//! Provides node-to-node deliveries: one durable row of `subagents_deliveries` per delivery,
//! announced to its target node with a `NOTIFY` on the node's channel (the row and the
//! announcement are one statement), served by the target — one at a time per session, in the
//! order they were sent, and sessions at once — and answered on the same row, announced back to
//! the sender the same way with the answer itself when it fits in a notification. A round trip
//! is three statements: send, claim, answer.
//!
//! # Guarantees
//! - A delivery is served at most once: the target claims it (pending → claimed) in the
//!   transaction that reads it, and answers it (claimed → answered) exactly once.
//! - A node serves the deliveries about one session one at a time, oldest first: deliveries
//!   one sender committed one after another about a session are served in that order
//!   (concurrent senders' interleave). Deliveries about different sessions are served
//!   concurrently, up to [`SERVED_AT_ONCE`].
//! - Answered and withdrawn rows are pruned once they are `PostgresConfig::delivery_retention`
//!   old (their senders read them long before), and so are rows that old sent to a node no
//!   longer live.
//! - A lost notification only delays: both sides also look at the table every
//!   [`RECHECK`]. A listener connection that fails is opened again with a bounded backoff.
//! - A sender whose target node's membership expired with the delivery still pending is told
//!   so (`SESSION_LEASED`: the session passes on once the dead node's leases expire), and the
//!   row is withdrawn so that the dead node, were it to wake, cannot serve it. One that expired
//!   while serving it gets the same error, saying the delivery may have been accepted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::reconnect::within;
use super::{io, uuid_of, NodeMembership, PostgresStore};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;

/// The longest answer an announcement carries (PostgreSQL's limit is 8,000 bytes).
const MAX_CARRIED: usize = 7_000;

/// How often each side looks at the table without a notification.
pub const RECHECK: Duration = Duration::from_millis(500);

/// The most deliveries a node serves at once (each about a different session).
pub const SERVED_AT_ONCE: usize = 64;

/// The longest a serving node waits between two prunings of old deliveries.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

tokio::task_local! {
    /// The slot of the delivery the current task serves.
    static SERVING: Arc<Slot>;
}

/// One served delivery's place among the [`SERVED_AT_ONCE`].
struct Slot {
    /// Whether the delivery gave its place up (see [`yield_slot`]).
    yielded: AtomicBool,
    /// How many deliveries of the server gave theirs up.
    server_yielded: Arc<AtomicUsize>,
    /// Woken when a place frees up: the server claims again.
    inbound: Arc<Inbound>,
}

/// Gives up the serving slot of the delivery the current task serves, for a handler about to
/// wait on another node (a release waiting for its child's release there): a node whose every
/// slot waited on a peer whose every slot waited on it would never serve again. The delivery's
/// session stays busy (its later deliveries still wait for its answer); the server claims
/// another in its place. Outside a served delivery, or a second time, it does nothing.
pub fn yield_slot() {
    let _ = SERVING.try_with(|slot| {
        if !slot.yielded.swap(true, Ordering::SeqCst) {
            slot.server_yielded.fetch_add(1, Ordering::SeqCst);
            slot.inbound.deliveries.notify_one();
        }
    });
}

/// One delivery, as its target node serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The row id: deliveries to one node are served in its order.
    pub id: i64,
    /// The node that sent it.
    pub sender: uuid::Uuid,
    /// The incarnation of `sender` that sent it (`None` from a node of an older schema).
    pub sent_by: Option<uuid::Uuid>,
    /// The session it is about.
    pub session: SessionId,
    /// What the sender sent.
    pub payload: Value,
    /// The sender's key for its answer's announcement.
    pub(super) ticket: uuid::Uuid,
}

/// A delivery's answer and the node incarnation that served it.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// What the target answered.
    pub value: Value,
    /// The incarnation of the target node that served it (`None` from a node of an older
    /// schema).
    pub by: Option<uuid::Uuid>,
}

/// How a node serves a delivery: its answer, or the typed error the sender gets back.
pub type DeliveryHandler = Arc<dyn Fn(Delivery) -> BoxFuture<'static, Result<Value>> + Send + Sync>;

/// How many old deliveries one pruning statement deletes.
const PRUNE_BATCH: i64 = 10_000;

/// The channel a node listens on (an unquoted identifier: lowercase hex only).
pub(super) fn channel_of(node: uuid::Uuid) -> String {
    format!("subagents_node_{}", node.simple())
}

/// What a node's listener hands on.
#[derive(Default)]
pub(super) struct Inbound {
    /// Woken when a delivery for this node was committed.
    pub(super) deliveries: Notify,
    /// The senders waiting for an answer, by delivery id: told the stored answer when the
    /// announcement carried it.
    pub(super) answers: Mutex<HashMap<uuid::Uuid, oneshot::Sender<Option<Value>>>>,
    /// Whether a server runs: one per node, or a session's deliveries would no longer be
    /// served in order.
    serving: AtomicBool,
}

impl std::fmt::Debug for Inbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbound").finish_non_exhaustive()
    }
}

impl Inbound {
    /// Routes one notification payload: `d` (a delivery for this node), or `a:<ticket>` or
    /// `a:<ticket>:<answer>` (the answer to one of its own, carried when it fits).
    fn route(&self, payload: &str) {
        if payload == "d" {
            self.deliveries.notify_one();
            return;
        }
        let Some(answer) = payload.strip_prefix("a:") else {
            return;
        };
        let (ticket, carried) = match answer.split_once(':') {
            Some((ticket, carried)) => (ticket, serde_json::from_str(carried).ok()),
            None => (answer, None),
        };
        let Ok(ticket) = ticket.parse::<uuid::Uuid>() else {
            return;
        };
        let waiting = self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ticket);
        if let Some(waiting) = waiting {
            let _ = waiting.send(carried);
        }
    }
}

/// The first wait before a lost listener connection is opened again; it doubles up to
/// [`LISTENER_BACKOFF_MAX`] while the server stays out of reach.
const LISTENER_BACKOFF: Duration = Duration::from_millis(100);

/// The longest wait between two attempts to open the listener connection again.
const LISTENER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Opens the connection that listens on `node`'s channel, driven until `stop`; notifications
/// go to `inbound`. A listener connection that fails (the server restarted, the backend was
/// terminated) is opened again with a bounded backoff; meanwhile, and for what was announced
/// while it was down, the rechecks find the deliveries.
///
/// # Errors
/// `STORE_IO` when the first connection cannot be opened or cannot listen.
pub(super) async fn listen(
    store: &PostgresStore,
    node: uuid::Uuid,
    inbound: Arc<Inbound>,
    stop: CancellationToken,
) -> Result<()> {
    let config = store.pg_config.clone();
    let deadline = store.call_deadline;
    let opening = "opening the cluster listener";
    let mut listening = within(
        opening,
        deadline,
        Listening::open(&config, node, &inbound, &stop),
    )
    .await?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                // First: a connection ended by the stop is no loss.
                biased;
                () = stop.cancelled() => return,
                _ = &mut listening.ended => {}
            }
            tracing::warn!(%node, "the cluster listener's connection was lost; opening it again");
            let mut backoff = LISTENER_BACKOFF;
            listening = loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                match within(
                    opening,
                    deadline,
                    Listening::open(&config, node, &inbound, &stop),
                )
                .await
                {
                    Ok(listening) => break listening,
                    Err(error) => {
                        tracing::warn!(%node, %error, ?backoff, "the cluster listener could not listen again; retrying");
                        backoff = (backoff * 2).min(LISTENER_BACKOFF_MAX);
                    }
                }
            };
            tracing::info!(%node, "the cluster listener listens again");
            // A delivery announced while it was down was not heard: look now.
            inbound.deliveries.notify_one();
        }
    });
    Ok(())
}

/// One listener connection: its client (the connection lives while it does) and the signal
/// that its connection ended.
struct Listening {
    _client: tokio_postgres::Client,
    ended: oneshot::Receiver<()>,
}

impl Listening {
    /// Connects, routes the connection's notifications to `inbound` until it ends or `stop`
    /// fires, and listens on `node`'s channel.
    async fn open(
        config: &tokio_postgres::Config,
        node: uuid::Uuid,
        inbound: &Arc<Inbound>,
        stop: &CancellationToken,
    ) -> Result<Self> {
        let (client, mut connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(io("opening the cluster listener"))?;
        let (ended_tx, ended) = oneshot::channel();
        let inbound = Arc::clone(inbound);
        let stop = stop.clone();
        tokio::spawn(async move {
            let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            futures::pin_mut!(messages);
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => return,
                    message = futures::StreamExt::next(&mut messages) => message,
                };
                match message {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(notice))) => {
                        inbound.route(notice.payload());
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::debug!(%node, %error, "the cluster listener's connection failed");
                        break;
                    }
                    None => break,
                }
            }
            let _ = ended_tx.send(());
        });
        client
            .batch_execute(&format!("LISTEN {}", channel_of(node)))
            .await
            .map_err(io("listening for deliveries"))?;
        Ok(Self {
            _client: client,
            ended,
        })
    }
}

/// An answer as stored: `{"ok": value, "by": incarnation}` or
/// `{"error": {"code", "message"}, "by": incarnation}`, `by` naming the node incarnation that
/// served it.
fn encode_answer(answer: &Result<Value>, by: uuid::Uuid) -> Value {
    match answer {
        Ok(value) => json!({ "ok": value, "by": by }),
        Err(error) => json!({
            "error": { "code": error.code(), "message": error.message() },
            "by": by,
        }),
    }
}

fn decode_answer(id: i64, stored: Value) -> Result<Served> {
    let mut stored = match stored {
        Value::Object(fields) => fields,
        _ => return Err(corrupt_answer(id)),
    };
    let by = stored
        .remove("by")
        .and_then(|by| serde_json::from_value(by).ok());
    if let Some(value) = stored.remove("ok") {
        return Ok(Served { value, by });
    }
    let error = stored.remove("error").ok_or_else(|| corrupt_answer(id))?;
    let code: ErrorCode =
        serde_json::from_value(error["code"].clone()).map_err(|_| corrupt_answer(id))?;
    let message = error["message"].as_str().unwrap_or_default();
    Err(SubagentError::new(code, message))
}

fn corrupt_answer(id: i64) -> SubagentError {
    SubagentError::new(
        ErrorCode::StoreCorrupt,
        format!("delivery {id}: its stored answer is malformed"),
    )
}

impl PostgresStore {
    /// Commits a delivery from `sender` (its incarnation `sent_by`) to `target` and announces
    /// it, in one statement; answers its row id. `ticket` keys the announcement of its answer.
    pub(super) async fn send_delivery(
        &self,
        (sender, sent_by): (uuid::Uuid, uuid::Uuid),
        target: uuid::Uuid,
        session: SessionId,
        payload: &Value,
        ticket: uuid::Uuid,
    ) -> Result<i64> {
        let failed = io(format!("delivering to node {target}"));
        let payload = serde_json::to_vec(payload).map_err(|error| {
            SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("a delivery's payload does not encode: {error}"),
            )
        })?;
        let payload = &payload;
        self.reconnecting("sending a delivery", |_| async {
            let client = self.client().await?;
            // Once per ticket: a retried send finds the row an earlier attempt committed.
            let sent = client
                .prepare_cached(
                    "WITH sent AS (
                         INSERT INTO subagents_deliveries
                             (target, sender, session, payload, ticket, sent_by)
                         VALUES ($1, $2, $3, $4, $5, $7)
                         ON CONFLICT (ticket) DO NOTHING RETURNING id
                     )
                     SELECT id, pg_notify($6, 'd')::text FROM sent
                     UNION ALL
                     SELECT id, NULL FROM subagents_deliveries
                     WHERE ticket = $5 AND NOT EXISTS (SELECT 1 FROM sent)",
                )
                .await
                .map_err(&failed)?;
            let row = client
                .query_one(
                    &sent,
                    &[
                        &target,
                        &sender,
                        &uuid_of(session),
                        payload,
                        &ticket,
                        &channel_of(target),
                        &sent_by,
                    ],
                )
                .await
                .map_err(&failed)?;
            Ok(row.get(0))
        })
        .await
    }

    /// The answer of delivery `id`, once it has one; withdraws it when its target's
    /// membership expired with it still pending.
    pub(super) async fn poll_answer(&self, id: i64) -> Result<Option<Served>> {
        self.reconnecting("reading a delivery's answer", |_| self.poll_answer_once(id))
            .await
    }

    async fn poll_answer_once(&self, id: i64) -> Result<Option<Served>> {
        let failed = io(format!("reading the answer to delivery {id}"));
        let client = self.client().await?;
        let read = client
            .prepare_cached(
                // A claimed delivery is being served while the incarnation that claimed it
                // lives; a pending one, while any incarnation of its target does.
                "SELECT delivery.state, delivery.answer,
                        coalesce(node.expires_at > now(), false),
                        coalesce(node.expires_at > now()
                            AND node.incarnation IS NOT DISTINCT FROM delivery.claimed_by, false)
                 FROM subagents_deliveries delivery
                 LEFT JOIN subagents_nodes node ON node.node = delivery.target
                 WHERE delivery.id = $1",
            )
            .await
            .map_err(&failed)?;
        let row = client.query_one(&read, &[&id]).await.map_err(&failed)?;
        let (state, answer, target_live, claimer_live): (String, Option<Vec<u8>>, bool, bool) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        match (state.as_str(), answer) {
            ("answered", Some(answer)) => {
                let answer = serde_json::from_slice(&answer).map_err(|_| corrupt_answer(id))?;
                decode_answer(id, answer).map(Some)
            }
            ("pending", _) if !target_live => {
                drop(client);
                if self.withdraw_pending(id).await? {
                    Err(SubagentError::new(
                        ErrorCode::SessionLeased,
                        format!(
                            "delivery {id}: the node holding its session stopped before serving \
                             it; the session passes on once that node's leases expire"
                        ),
                    ))
                } else {
                    // Claimed meanwhile: the answer comes.
                    Ok(None)
                }
            }
            ("claimed", _) if !claimer_live => Err(SubagentError::new(
                ErrorCode::SessionLeased,
                format!(
                    "delivery {id}: the node holding its session stopped (or was restarted) \
                     while serving it (it may have been accepted); the session passes on once \
                     that node's leases expire"
                ),
            )),
            _ => Ok(None),
        }
    }

    /// Withdraws delivery `id` if it is still pending: `true` when this withdrew it (it will
    /// never be served).
    pub(super) async fn withdraw_pending(&self, id: i64) -> Result<bool> {
        self.reconnecting("withdrawing a delivery", |_| self.withdraw_pending_once(id))
            .await
    }

    async fn withdraw_pending_once(&self, id: i64) -> Result<bool> {
        let failed = io(format!("withdrawing delivery {id}"));
        let client = self.client().await?;
        let withdraw = client
            .prepare_cached(
                "UPDATE subagents_deliveries SET state = 'withdrawn'
                 WHERE id = $1 AND state = 'pending'",
            )
            .await
            .map_err(&failed)?;
        Ok(client.execute(&withdraw, &[&id]).await.map_err(&failed)? == 1)
    }

    /// Claims up to `room` of `node`'s pending deliveries, each the oldest pending one of its
    /// session, none about a session in `busy` (served now), oldest first; and whether any
    /// pending one was left behind (about a busy session, behind a claimed one, or past the
    /// room). With nothing claimed, nothing is known of what was left.
    pub(super) async fn claim_deliveries(
        &self,
        node: uuid::Uuid,
        incarnation: uuid::Uuid,
        busy: &[uuid::Uuid],
        room: usize,
    ) -> Result<(Vec<Delivery>, bool)> {
        let failed = io(format!("claiming deliveries for node {node}"));
        let client = self.client().await?;
        let claim = client
            .prepare_cached(
                // The count reads the table as it was before the update (one statement, one
                // snapshot): pending then, claimed now included.
                "WITH claimed AS (
                 UPDATE subagents_deliveries SET state = 'claimed', claimed_by = $4
                 WHERE state = 'pending' AND id IN (
                     SELECT pending.id FROM subagents_deliveries pending
                     WHERE pending.target = $1 AND pending.state = 'pending'
                       AND pending.session <> ALL($2)
                       AND NOT EXISTS (
                           SELECT 1 FROM subagents_deliveries older
                           WHERE older.target = $1 AND older.session = pending.session
                             AND older.state = 'pending' AND older.id < pending.id
                       )
                     ORDER BY pending.id LIMIT $3 FOR UPDATE SKIP LOCKED
                 )
                 AND EXISTS (
                     SELECT 1 FROM subagents_nodes
                     WHERE node = $1 AND incarnation = $4 AND expires_at > now()
                 )
                 RETURNING id, sender, session, payload, ticket, sent_by
                 )
                 SELECT claimed.*, (
                     SELECT count(*) FROM subagents_deliveries
                     WHERE target = $1 AND state = 'pending'
                 ) FROM claimed",
            )
            .await
            .map_err(&failed)?;
        let room = i64::try_from(room).unwrap_or(i64::MAX);
        let rows = client
            .query(&claim, &[&node, &busy, &room, &incarnation])
            .await
            .map_err(&failed)?;
        let pending_before: i64 = rows.first().map_or(0, |row| row.get(6));
        let left_behind = usize::try_from(pending_before).unwrap_or(usize::MAX) > rows.len();
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let payload: Vec<u8> = row.get(3);
            let mut delivery = Delivery {
                id: row.get(0),
                sender: row.get(1),
                sent_by: row.get(5),
                session: SessionId::from_uuid(row.get(2)),
                payload: Value::Null,
                ticket: row.get(4),
            };
            match serde_json::from_slice(&payload) {
                Ok(payload) => {
                    delivery.payload = payload;
                    claimed.push(delivery);
                }
                // Claimed already: answered here, so its sender hears why and the rest of the
                // batch is served.
                Err(_) => {
                    let id = delivery.id;
                    let malformed = Err(SubagentError::new(
                        ErrorCode::StoreCorrupt,
                        format!("delivery {id}: its stored payload is malformed"),
                    ));
                    if let Err(error) = self
                        .answer_delivery(&delivery, &malformed, incarnation)
                        .await
                    {
                        tracing::warn!(delivery = id, %error, "answering a malformed delivery failed");
                    }
                }
            }
        }
        claimed.sort_by_key(|delivery| delivery.id);
        Ok((claimed, left_behind))
    }

    /// Puts back the deliveries `incarnation` of `node` claimed and is not serving (about no
    /// session in `busy`): a claim whose answer was lost with its connection. They are claimed
    /// again, in order, like any pending delivery.
    pub(super) async fn unclaim_lost(
        &self,
        node: uuid::Uuid,
        incarnation: uuid::Uuid,
        busy: &[uuid::Uuid],
    ) -> Result<u64> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE subagents_deliveries SET state = 'pending', claimed_by = NULL
                 WHERE target = $1 AND state = 'claimed' AND claimed_by = $2
                   AND session <> ALL($3)",
                &[&node, &incarnation, &busy],
            )
            .await
            .map_err(io(format!("putting back node {node}'s lost claims")))
    }

    /// Removes the deliveries answered or withdrawn more than the retention ago, and those
    /// sent that long ago to a node that is no longer live (whichever node sent or served
    /// them: a cluster's nodes come and go, and any of them prunes for all).
    async fn prune_deliveries(&self) -> Result<()> {
        let client = self.client().await?;
        // A batch at a time, each its own statement: a backlog is pruned in steps that each
        // end well within the statement timeout, and what a cut-off pruning deleted stays so.
        loop {
            let pruned = client
                .execute(
                    "DELETE FROM subagents_deliveries WHERE id IN (
                         SELECT delivery.id FROM subagents_deliveries delivery
                         WHERE coalesce(delivery.answered_at, delivery.sent_at)
                               < now() - make_interval(secs => $1)
                           AND (delivery.state IN ('answered', 'withdrawn') OR NOT EXISTS (
                               SELECT 1 FROM subagents_nodes node
                               WHERE node.node = delivery.target AND node.expires_at > now()
                           ))
                         LIMIT $2
                     )",
                    &[&self.delivery_retention.as_secs_f64(), &PRUNE_BATCH],
                )
                .await
                .map_err(io("pruning old deliveries"))?;
            if pruned < u64::try_from(PRUNE_BATCH).unwrap_or(u64::MAX) {
                return Ok(());
            }
        }
    }

    /// Stores the answer to a claimed delivery and announces it to its sender, carrying it in
    /// the announcement when it fits (one statement: the row and the announcement commit
    /// together).
    pub(super) async fn answer_delivery(
        &self,
        delivery: &Delivery,
        answer: &Result<Value>,
        by: uuid::Uuid,
    ) -> Result<()> {
        self.reconnecting("answering a delivery", |_| {
            self.answer_delivery_once(delivery, answer, by)
        })
        .await
    }

    async fn answer_delivery_once(
        &self,
        delivery: &Delivery,
        answer: &Result<Value>,
        by: uuid::Uuid,
    ) -> Result<()> {
        let id = delivery.id;
        let failed = io(format!("answering delivery {id}"));
        let stored = encode_answer(answer, by);
        let encoded = serde_json::to_vec(&stored)
            .map_err(|error| SubagentError::bug(format!("an answer does not encode: {error}")))?;
        let ticket = delivery.ticket;
        let announcement = match String::from_utf8(encoded.clone()) {
            Ok(text) if text.len() <= MAX_CARRIED => format!("a:{ticket}:{text}"),
            _ => format!("a:{ticket}"),
        };
        let client = self.client().await?;
        let answered = client
            .prepare_cached(
                "WITH answered AS (
                     UPDATE subagents_deliveries SET state = 'answered', answer = $2,
                     answered_at = now() WHERE id = $1 AND state = 'claimed'
                     RETURNING id
                 )
                 SELECT pg_notify($3, $4) FROM answered",
            )
            .await
            .map_err(&failed)?;
        client
            .execute(
                &answered,
                &[&id, &encoded, &channel_of(delivery.sender), &announcement],
            )
            .await
            .map_err(&failed)?;
        Ok(())
    }
}

/// A committed delivery whose answer has not been read yet. Dropping it stops waiting: the
/// delivery is still served, and its answer is left on its row.
#[derive(Debug)]
pub struct SentDelivery<'a> {
    membership: &'a NodeMembership,
    target: uuid::Uuid,
    id: i64,
    ticket: uuid::Uuid,
    announced: futures::future::Fuse<oneshot::Receiver<Option<Value>>>,
}

impl SentDelivery<'_> {
    /// The delivery's row id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The target's answer, waited for no longer than the store's
    /// `PostgresConfig::delivery_deadline`.
    ///
    /// # Errors
    /// The target's own typed error; `SESSION_LEASED` when the target's membership expired
    /// with the delivery unserved (the delivery is withdrawn) or mid-serving;
    /// `NODE_UNRESPONSIVE` when the deadline passed (see [`SentDelivery::answer_within`]);
    /// `STORE_IO`.
    pub async fn answer(self) -> Result<Value> {
        let deadline = self.membership.store.delivery_deadline;
        Ok(self.answer_within(deadline).await?.value)
    }

    /// The target's answer and the incarnation that served it, waited for no longer than
    /// `deadline`. On expiry a delivery the
    /// target never took is withdrawn (it will not be served); one it took and did not answer
    /// may have been served.
    ///
    /// # Errors
    /// As [`SentDelivery::answer`]; `NODE_UNRESPONSIVE` when `deadline` passed first.
    pub async fn answer_within(mut self, deadline: Duration) -> Result<Served> {
        match tokio::time::timeout(deadline, self.wait_for_answer()).await {
            Ok(answer) => answer,
            Err(_) => self.expire(deadline).await,
        }
    }

    /// The deadline passed: withdraws the delivery if the target never took it; otherwise
    /// answers what the row holds now, or that the target may have served it.
    async fn expire(&self, deadline: Duration) -> Result<Served> {
        let (id, target) = (self.id, self.target);
        let store = &self.membership.store;
        if store.withdraw_pending(id).await? {
            return Err(SubagentError::new(
                ErrorCode::NodeUnresponsive,
                format!(
                    "node {target} did not take delivery {id} within {deadline:?}: it was \
                     withdrawn and will not be served"
                ),
            ));
        }
        match store.poll_answer(id).await? {
            Some(answer) => Ok(answer),
            None => Err(SubagentError::new(
                ErrorCode::NodeUnresponsive,
                format!(
                    "node {target} took delivery {id} but did not answer within {deadline:?}: \
                     it may have been served"
                ),
            )),
        }
    }

    async fn wait_for_answer(&mut self) -> Result<Served> {
        loop {
            // The announcement (which usually carries the answer), or a recheck in case it was
            // lost.
            match tokio::time::timeout(RECHECK, &mut self.announced).await {
                Ok(Ok(Some(carried))) => return decode_answer(self.id, carried),
                Ok(Ok(None)) => {}
                // Announced without the answer, its channel is gone, or a recheck is due.
                Ok(Err(_)) | Err(_) => {}
            }
            // (Once the announcement has come, the fused wait above is a plain recheck delay.)
            if let Some(value) = self.membership.store.poll_answer(self.id).await? {
                return Ok(value);
            }
        }
    }
}

impl Drop for SentDelivery<'_> {
    fn drop(&mut self) {
        self.membership
            .inbound
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.ticket);
    }
}

impl NodeMembership {
    /// Commits a delivery of `payload` about `session` to node `target`. Deliveries about one
    /// session that one node commits one after another are served in that order.
    ///
    /// # Errors
    /// `INVALID_ARGS` for a payload that does not encode; `STORE_IO`.
    pub async fn send(
        &self,
        target: uuid::Uuid,
        session: SessionId,
        payload: &Value,
    ) -> Result<SentDelivery<'_>> {
        let (answered, announced) = oneshot::channel();
        // Registered before the delivery is sent, so the announcement of its answer cannot
        // come first.
        let ticket = uuid::Uuid::new_v4();
        self.inbound
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ticket, answered);
        // Built before the send, so the ticket is withdrawn however this future ends.
        let mut sent_delivery = SentDelivery {
            membership: self,
            target,
            id: 0,
            ticket,
            announced: futures::FutureExt::fuse(announced),
        };
        sent_delivery.id = self
            .store
            .send_delivery(
                (self.node, self.incarnation),
                target,
                session,
                payload,
                ticket,
            )
            .await?;
        Ok(sent_delivery)
    }

    /// [`NodeMembership::send`], then [`SentDelivery::answer`].
    ///
    /// # Errors
    /// As the two calls.
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait; a delivery already committed is still served.
    pub async fn deliver(
        &self,
        target: uuid::Uuid,
        session: SessionId,
        payload: &Value,
    ) -> Result<Value> {
        self.send(target, session, payload).await?.answer().await
    }

    /// [`NodeMembership::deliver`], answering also which incarnation of `target` served it.
    ///
    /// # Errors
    /// As [`NodeMembership::deliver`].
    pub async fn deliver_served(
        &self,
        target: uuid::Uuid,
        session: SessionId,
        payload: &Value,
    ) -> Result<Served> {
        let deadline = self.store.delivery_deadline;
        self.send(target, session, payload)
            .await?
            .answer_within(deadline)
            .await
    }

    /// Serves this node's deliveries with `handler` until the membership is left, dropped or
    /// lost: those about one session one at a time in the order they were committed, those
    /// about different sessions at once (up to [`SERVED_AT_ONCE`]). A handler that panics
    /// answers its delivery with an error, and serving goes on.
    ///
    /// # Errors
    /// `INVALID_ARGS` when this node already serves.
    pub fn serve(&self, handler: DeliveryHandler) -> Result<()> {
        if self.inbound.serving.swap(true, Ordering::SeqCst) {
            return Err(SubagentError::new(
                ErrorCode::InvalidArgs,
                format!("node {} already serves its deliveries", self.node),
            ));
        }
        let server = Server {
            store: Arc::clone(&self.store),
            node: self.node,
            incarnation: self.incarnation,
            handler,
            stop: self.stop.clone(),
            busy: Arc::default(),
            yielded: Arc::default(),
            finished: Arc::default(),
            inbound: Arc::clone(&self.inbound),
        };
        tokio::spawn(server.run());
        Ok(())
    }
}

/// A node's delivery server: claims what it may serve, serves each delivery as a task of its
/// own, and keeps one delivery per session in flight.
struct Server {
    store: Arc<PostgresStore>,
    node: uuid::Uuid,
    /// The incarnation that serves: it claims only while its row is its own.
    incarnation: uuid::Uuid,
    handler: DeliveryHandler,
    stop: CancellationToken,
    /// The sessions a delivery is being served about.
    busy: Arc<Mutex<HashSet<SessionId>>>,
    /// How many of those gave their slot up (see [`yield_slot`]).
    yielded: Arc<AtomicUsize>,
    inbound: Arc<Inbound>,
    /// Woken when a delivery's service ended (its session may have more).
    finished: Arc<Notify>,
}

impl Server {
    async fn run(self) {
        let inbound = Arc::clone(&self.inbound);
        let mut pruned = tokio::time::Instant::now();
        let mut claim = true;
        // Whether the last claim may have left pending deliveries behind (about a busy
        // session, or behind one it claimed). Only then does a served delivery's end call for
        // a new claim; otherwise what comes next is announced.
        let mut left_behind = false;
        // Set after a claim failed: it may have claimed rows whose answer it never read.
        let mut unclaim = false;
        loop {
            if claim {
                let busy: Vec<uuid::Uuid> = self
                    .busy
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .map(|session| *session.as_uuid())
                    .collect();
                let holding = busy
                    .len()
                    .saturating_sub(self.yielded.load(Ordering::SeqCst));
                let room = SERVED_AT_ONCE.saturating_sub(holding);
                // With no room, or nothing claimed, anything pending is behind a busy session.
                left_behind = !busy.is_empty();
                if unclaim {
                    let unclaimed = self.store.bounded(
                        "putting back lost claims",
                        self.store.unclaim_lost(self.node, self.incarnation, &busy),
                    );
                    match unclaimed.await {
                        Ok(put_back) => {
                            unclaim = false;
                            if put_back > 0 {
                                tracing::info!(node = %self.node, put_back, "put back deliveries whose claim was lost with its connection");
                            }
                        }
                        Err(error) => {
                            tracing::warn!(node = %self.node, %error, "putting back lost claims failed; retrying");
                        }
                    }
                }
                if room > 0 && !unclaim {
                    let claimed = tokio::select! {
                        () = self.stop.cancelled() => return,
                        claimed = self.store.bounded(
                            "claiming deliveries",
                            self.store.claim_deliveries(self.node, self.incarnation, &busy, room),
                        ) => claimed,
                    };
                    match claimed {
                        Ok((claimed, more)) => {
                            let full = claimed.len() == room;
                            if !claimed.is_empty() {
                                left_behind = more;
                            }
                            for delivery in claimed {
                                self.spawn_serving(delivery);
                            }
                            // A full batch may have left more behind.
                            if full {
                                continue;
                            }
                        }
                        Err(error) => {
                            unclaim = true;
                            tracing::warn!(node = %self.node, %error, "claiming deliveries failed; retrying");
                        }
                    }
                }
            }
            if pruned.elapsed() >= PRUNE_EVERY.min(self.store.delivery_retention) {
                pruned = tokio::time::Instant::now();
                // On its own: a slow pruning never holds up a claim or a stop.
                let store = Arc::clone(&self.store);
                let node = self.node;
                tokio::spawn(async move {
                    let pruned = store.bounded("pruning deliveries", store.prune_deliveries());
                    if let Err(error) = pruned.await {
                        tracing::debug!(%node, %error, "pruning old deliveries failed");
                    }
                    let pruned = store.bounded("pruning dead nodes", store.prune_dead_nodes());
                    if let Err(error) = pruned.await {
                        tracing::debug!(%node, %error, "pruning dead nodes' rows failed");
                    }
                });
            }
            claim = tokio::select! {
                () = self.stop.cancelled() => return,
                () = inbound.deliveries.notified() => true,
                () = self.finished.notified() => left_behind,
                () = tokio::time::sleep(RECHECK) => true,
            };
        }
    }

    /// Serves `delivery` as a task of its own and answers it; its session is busy meanwhile.
    fn spawn_serving(&self, delivery: Delivery) {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(delivery.session);
        let (store, handler, stop) = (
            Arc::clone(&self.store),
            Arc::clone(&self.handler),
            self.stop.clone(),
        );
        let (busy, finished, node, incarnation) = (
            Arc::clone(&self.busy),
            Arc::clone(&self.finished),
            self.node,
            self.incarnation,
        );
        let slot = Arc::new(Slot {
            yielded: AtomicBool::new(false),
            server_yielded: Arc::clone(&self.yielded),
            inbound: Arc::clone(&self.inbound),
        });
        tokio::spawn(async move {
            let answer = SERVING
                .scope(Arc::clone(&slot), handle(&handler, &delivery))
                .await;
            // Its sender waits for it: a passing fault is retried.
            while let Err(error) = store.answer_delivery(&delivery, &answer, incarnation).await {
                tracing::warn!(%node, delivery = delivery.id, %error, "a delivery's answer could not be stored; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RECHECK) => {}
                }
            }
            busy.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&delivery.session);
            if slot.yielded.load(Ordering::SeqCst) {
                slot.server_yielded.fetch_sub(1, Ordering::SeqCst);
            }
            finished.notify_one();
        });
    }
}

/// `handler`'s answer to `delivery`; a panic in it is the delivery's error, not the server's
/// end (its sender would otherwise wait on a claimed row for as long as the node lives).
async fn handle(handler: &DeliveryHandler, delivery: &Delivery) -> Result<Value> {
    use futures::FutureExt;
    let panicked =
        || SubagentError::bug(format!("the handler of delivery {} panicked", delivery.id));
    let answer =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(delivery.clone())))
            .map_err(|_| panicked())?;
    std::panic::AssertUnwindSafe(answer)
        .catch_unwind()
        .await
        .unwrap_or_else(|_| Err(panicked()))
}
