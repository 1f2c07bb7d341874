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
//! - A lost notification only delays: both sides also look at the table, a node for what to
//!   serve every [`RECHECK`], a sender for its answer after [`RECHECK`] and then less often
//!   the longer it waits, up to [`RECHECK_MAX`] (thousands of senders waiting behind a backlog
//!   would otherwise each read their row twice a second, loading the server the backlog waits
//!   on). A listener connection that fails is opened again with a bounded backoff.
//! - A sender whose target node's membership expired with the delivery still pending is told
//!   so (`SESSION_LEASED`: the session passes on once the dead node's leases expire), and the
//!   row is withdrawn so that the dead node, were it to wake, cannot serve it. One that expired
//!   while serving it gets the same error, saying the delivery may have been accepted.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use super::{io, uuid_of, NodeMembership, PostgresStore};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;

mod listener;
mod serving;

pub(super) use listener::{channel_of, listen, Inbound};
pub use serving::yield_slot;

/// The longest answer an announcement carries (PostgreSQL's limit is 8,000 bytes).
const MAX_CARRIED: usize = 7_000;

/// How often each side looks at the table without a notification (a sender: at first).
pub const RECHECK: Duration = Duration::from_millis(500);

/// The longest a sender waits between two looks at its delivery's row.
pub const RECHECK_MAX: Duration = Duration::from_secs(4);

/// The most deliveries a node serves at once (each about a different session).
pub const SERVED_AT_ONCE: usize = 64;

/// The longest a serving node waits between two prunings of old deliveries.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

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
                // Each candidate is its session's oldest pending delivery, looked up by its
                // session (a correlated `min`, which the planner cannot turn into a join: an
                // anti-join planned on a young table's statistics scanned every pending
                // delivery of the node for each candidate, 31 ms a claim under a backlog of
                // thousands). The count reads the table as it was before the update (one
                // statement, one snapshot): pending then, claimed now included; it stops one
                // past the room, enough to tell whether more was pending than was claimed.
                "WITH claimed AS (
                 UPDATE subagents_deliveries SET state = 'claimed', claimed_by = $4
                 WHERE state = 'pending' AND id IN (
                     SELECT pending.id FROM subagents_deliveries pending
                     WHERE pending.target = $1 AND pending.state = 'pending'
                       AND pending.session <> ALL($2)
                       AND pending.id = (
                           SELECT min(oldest.id) FROM subagents_deliveries oldest
                           WHERE oldest.target = $1 AND oldest.session = pending.session
                             AND oldest.state = 'pending'
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
                     SELECT count(*) FROM (
                         SELECT 1 FROM subagents_deliveries
                         WHERE target = $1 AND state = 'pending' LIMIT $3 + 1
                     ) pending
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
        let mut recheck = RECHECK;
        loop {
            // The announcement (which usually carries the answer), or a recheck in case it was
            // lost.
            match tokio::time::timeout(recheck, &mut self.announced).await {
                Ok(Ok(Some(carried))) => return decode_answer(self.id, carried),
                Ok(Ok(None)) => {}
                // Announced without the answer, its channel is gone, or a recheck is due.
                Ok(Err(_)) | Err(_) => {}
            }
            // (Once the announcement has come, the fused wait above is a plain recheck delay.)
            if let Some(value) = self.membership.store.poll_answer(self.id).await? {
                return Ok(value);
            }
            recheck = (recheck * 2).min(RECHECK_MAX);
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
}
