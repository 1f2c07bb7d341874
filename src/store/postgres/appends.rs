//! Compare-and-appends, many sessions to a statement (see [`batch`](super::batch)).
//!
//! # Why
//! Every epoch of every child appends its events as its turns end, so a load of hundreds of
//! children in flight appends to hundreds of sessions at once. One statement per append cost
//! the server a statement's overhead each (the plan's start, a snapshot, a commit record): on a
//! two-core machine the server's own processor time was twice the runtime's, and appends were
//! half of it. A batch appends to every session waiting in one statement, each append checked
//! and applied exactly as alone.

use std::sync::Arc;

use deadpool_postgres::Pool;

use super::batch::{in_rounds, Lock};
use super::pool::{checkout, Pooled};
use super::reconnect::Attempt;
use super::{io, lease_live, pool_io, seq_value, uuid_of};
use crate::error::{Result, SubagentError};
use crate::ids::SessionId;
use crate::store::lease::{lease_expired, LeaseEpoch};
use crate::store::{check_append, not_found};

/// One compare-and-append: the batch `events` (encoded) goes at `expected` in session `id`,
/// whose head then moves to `next`, under the writer's lease `epoch` (none: an unleased write).
/// The bytes are shared: a batched call keeps a copy of its request.
#[derive(Debug, Clone)]
pub(super) struct AppendRequest {
    pub(super) id: SessionId,
    pub(super) expected: i64,
    pub(super) next: i64,
    pub(super) epoch: Option<i64>,
    pub(super) events: Arc<[u8]>,
}

/// Appends `requests`, each as if alone, one statement for every session asked once; a session
/// asked again in the same batch (its writer does not overlap its appends, so only by accident)
/// waits for the next statement, in order. A session whose row another transaction holds is
/// skipped by the batch's statement and appended alone, waiting for the row: a row held past
/// the statement timeout fails its own append, not the batch's. On an attempt after a lost
/// connection, an append found stored with exactly its bytes is taken for the lost attempt's
/// own.
///
/// # Errors
/// `STORE_IO` for a statement (every request not yet answered fails with it).
pub(super) async fn append_many(
    pool: &Pool,
    requests: &[AppendRequest],
    attempt: Attempt,
) -> Result<Vec<Result<()>>> {
    let client = checkout(pool)
        .await
        .map_err(pool_io("connecting to PostgreSQL for appends"))?;
    let client = &client;
    // A lost connection sends the whole batch again, where what the earlier rounds stored is
    // found stored.
    in_rounds(
        requests.len(),
        |index| requests[index].id,
        "an append",
        |round, lock| async move { append_round(client, requests, &round, (attempt, lock)).await },
    )
    .await
}

/// The compare-and-append statement, its rows locked as `$lock` says (`SKIP LOCKED` or not).
macro_rules! append_statement {
    ($lock:literal) => {
        concat!(
            "WITH asked AS (
                 SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bytea[],
                                      $5::bigint[])
                     AS a(session, expected, epoch, events, next)
             ), head AS (
                 SELECT id, next_seq, epoch FROM subagents_sessions
                 WHERE id = ANY($1) ORDER BY id FOR UPDATE ",
            $lock,
            "
             ), judged AS (
                 SELECT asked.*, head.next_seq AS stored_next, head.epoch AS stored_epoch,
                     asked.epoch IS NULL OR coalesce((
                         SELECT ",
            lease_live!("clock_timestamp()"),
            " FROM subagents_leases lease
                         LEFT JOIN subagents_nodes node ON node.node = lease.holder
                         WHERE lease.session = asked.session AND lease.epoch = asked.epoch
                     ), false) AS live
                 FROM asked JOIN head ON head.id = asked.session
             ), fits AS (
                 SELECT * FROM judged
                 WHERE stored_next = expected
                     AND (epoch IS NULL OR (stored_epoch = epoch AND live))
             ), batch AS (
                 INSERT INTO subagents_event_batches (session, first_seq, events)
                 SELECT session, expected, events FROM fits
             ), moved AS (
                 UPDATE subagents_sessions s SET next_seq = fits.next
                 FROM fits WHERE s.id = fits.session
                 RETURNING s.id
             )
             SELECT asked.session, judged.stored_next, judged.stored_epoch,
                 EXISTS (SELECT 1 FROM moved WHERE moved.id = asked.session), judged.live,
                 EXISTS (SELECT 1 FROM subagents_sessions s WHERE s.id = asked.session)
             FROM asked LEFT JOIN judged ON judged.session = asked.session"
        )
    };
}

/// One statement for the appends `round` names (distinct sessions, in session order): each
/// one's answer, or `None` for one whose row was held elsewhere (with [`Lock::Skip`]).
async fn append_round(
    client: &Pooled,
    requests: &[AppendRequest],
    round: &[usize],
    (attempt, lock): (Attempt, Lock),
) -> Result<Vec<Option<Result<()>>>> {
    let failed = io(format!("appending to {} sessions", round.len()));
    // One statement: each session's row lock, compare, batch and head move together. A leased
    // write needs the latest epoch and a lease still live: a node paused past its time-to-live
    // may wake before it learns it was declared dead, and before anyone took its sessions;
    // what it would write then is an epoch its parent already heard end. Each session's lease
    // is read after its row is locked (`head` yields a row only once it holds its lock, and a
    // takeover locks the row first), and the clock then, not at the statement's start.
    let statement = match lock {
        Lock::Skip => {
            client
                .prepare_cached(append_statement!("SKIP LOCKED"))
                .await
        }
        Lock::Wait => client.prepare_cached(append_statement!("")).await,
    }
    .map_err(&failed)?;
    let sessions: Vec<uuid::Uuid> = round.iter().map(|&i| uuid_of(requests[i].id)).collect();
    let expected: Vec<i64> = round.iter().map(|&i| requests[i].expected).collect();
    let epochs: Vec<Option<i64>> = round.iter().map(|&i| requests[i].epoch).collect();
    let events: Vec<&[u8]> = round.iter().map(|&i| &*requests[i].events).collect();
    let next: Vec<i64> = round.iter().map(|&i| requests[i].next).collect();
    let rows = client
        .query(&statement, &[&sessions, &expected, &epochs, &events, &next])
        .await
        .map_err(&failed)?;
    let mut outcomes = Vec::with_capacity(round.len());
    for &index in round {
        let request = &requests[index];
        let session = uuid_of(request.id);
        let row = rows
            .iter()
            .find(|row| row.get::<_, uuid::Uuid>(0) == session)
            .ok_or_else(|| SubagentError::bug("an append's row is missing from its batch"))?;
        let stored: Option<(i64, i64, bool, bool)> = row
            .get::<_, Option<i64>>(1)
            .zip(row.get::<_, Option<i64>>(2))
            .map(|(next, epoch)| (next, epoch, row.get(3), row.get(4)));
        let present: bool = row.get(5);
        outcomes.push(match stored {
            // Held by another transaction: asked again alone, waiting for it.
            None if present && lock == Lock::Skip => None,
            None => Some(Err(not_found(request.id))),
            Some((_, _, true, _)) => Some(Ok(())),
            Some((stored_next, stored_epoch, false, live)) => {
                Some(refused(client, request, (stored_next, stored_epoch, live), attempt).await?)
            }
        })
    }
    Ok(outcomes)
}

/// Why an append that was not applied was not: an earlier attempt whose answer was lost may
/// have stored this very batch; otherwise the conflict, the lost or expired lease.
///
/// # Errors
/// The outer one: `STORE_IO` reading the stored batch back (the whole batch is tried again).
async fn refused(
    client: &Pooled,
    request: &AppendRequest,
    (stored_next, stored_epoch, live): (i64, i64, bool),
    attempt: Attempt,
) -> Result<Result<()>> {
    let id = request.id;
    if attempt.after_loss
        && stored_next == request.next
        && request.epoch.is_none_or(|epoch| epoch == stored_epoch)
    {
        let stored = client
            .query_opt(
                "SELECT events FROM subagents_event_batches WHERE session = $1 AND first_seq = $2",
                &[&uuid_of(id), &request.expected],
            )
            .await
            .map_err(io(format!("reading session {id}")))?;
        if stored.is_some_and(|row| row.get::<_, &[u8]>(0) == &*request.events) {
            return Ok(Ok(()));
        }
    }
    Ok(explain(request, stored_next, stored_epoch, live))
}

/// The refusal of an append that found the head at `stored_next` under `stored_epoch`.
fn explain(request: &AppendRequest, stored_next: i64, stored_epoch: i64, live: bool) -> Result<()> {
    let id = request.id;
    check_append(
        id,
        seq_value(request.expected)?,
        seq_value(stored_next)?,
        request.epoch.map(seq_value).transpose()?.map(LeaseEpoch),
        seq_value(stored_epoch)?,
    )?;
    if !live {
        return Err(lease_expired(id));
    }
    Err(SubagentError::bug(format!(
        "session {id}: an append that fits was not applied"
    )))
}
