//! Projection-cache writes, many rows to a statement (see [`batch`](super::batch)).
//!
//! # Why
//! Every epoch's release writes its session's projection checkpoint, and every write into an
//! away parent's inbox its checkpoint too: about one row per epoch, as many as the appends'
//! batches. One statement each cost the server a statement's overhead each; a batch writes
//! every row waiting in one statement, each fenced by its writer's lease as alone.

use std::sync::Arc;

use deadpool_postgres::Pool;

use super::batch::{in_rounds, Lock};
use super::pool::{checkout, Pooled};
use super::{io, pool_io, uuid_of};
use crate::error::{Result, SubagentError};
use crate::ids::SessionId;
use crate::store::lease::lease_lost;

/// One row to write: `row` for (`unit`, `id`), under the writer's lease `epoch` (none: an
/// unleased write, which nothing fences). The bytes are shared: a batched call keeps a copy of
/// its request.
#[derive(Debug, Clone)]
pub(super) struct CachePutRequest {
    pub(super) unit: Arc<str>,
    pub(super) id: SessionId,
    pub(super) row: Arc<[u8]>,
    pub(super) epoch: Option<i64>,
}

/// Writes `requests`, each as if alone and in order: a leased write lands while its epoch is
/// the session's (`LEASE_LOST` otherwise); a row asked again in the same batch is written by
/// the next statement, so the later asker's bytes stay. A leased write whose session row
/// another transaction holds (an append or a lease grant under way) is skipped by the batch's
/// statement and written alone, waiting for the row: a row held past the statement timeout
/// fails its own write, not the batch's. Idempotent: a batch whose answer was lost is simply
/// sent again.
///
/// # Errors
/// `STORE_IO` for a statement (every request not yet answered fails with it).
pub(super) async fn put_many(pool: &Pool, requests: &[CachePutRequest]) -> Result<Vec<Result<()>>> {
    let client = checkout(pool)
        .await
        .map_err(pool_io("connecting to PostgreSQL for the projection cache"))?;
    let client = &client;
    // A lost connection sends the whole batch again: writing a row twice writes it once.
    in_rounds(
        requests.len(),
        |index| (requests[index].id, &*requests[index].unit),
        "a cache write",
        |round, lock| async move { put_round(client, requests, &round, lock).await },
    )
    .await
}

/// The writes' statement, their sessions' rows locked as `$lock` says (`SKIP LOCKED` or not).
/// The leased writes' sessions are locked in share mode: a lease taken meanwhile (which moves
/// the epoch under `FOR UPDATE`) either waits for this write or fences it out. Each asked row
/// answers whether it landed, and whether its session's row was skipped (held elsewhere).
macro_rules! put_statement {
    ($lock:literal) => {
        concat!(
            "WITH asked AS (
                 SELECT * FROM unnest($1::text[], $2::uuid[], $3::bytea[], $4::bigint[])
                     WITH ORDINALITY AS a(unit, session, row, epoch, i)
             ), fence AS (
                 SELECT id, epoch FROM subagents_sessions
                 WHERE id IN (SELECT session FROM asked WHERE epoch IS NOT NULL)
                 ORDER BY id FOR SHARE ",
            $lock,
            "
             ), allowed AS (
                 SELECT asked.* FROM asked
                 WHERE asked.epoch IS NULL OR EXISTS (
                     SELECT 1 FROM fence
                     WHERE fence.id = asked.session AND fence.epoch = asked.epoch
                 )
             ), written AS (
                 INSERT INTO subagents_projection_cache (unit, session, row)
                 SELECT unit, session, row FROM allowed ORDER BY i
                 ON CONFLICT (unit, session) DO UPDATE SET row = excluded.row
             )
             SELECT asked.i,
                 EXISTS (SELECT 1 FROM allowed WHERE allowed.i = asked.i),
                 asked.epoch IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM fence WHERE fence.id = asked.session)
                     AND EXISTS (SELECT 1 FROM subagents_sessions s WHERE s.id = asked.session)
             FROM asked"
        )
    };
}

/// One statement for the rows `round` names (distinct keys, in key order): each one's answer,
/// or `None` for a leased write whose session's row was held elsewhere (with [`Lock::Skip`]).
async fn put_round(
    client: &Pooled,
    requests: &[CachePutRequest],
    round: &[usize],
    lock: Lock,
) -> Result<Vec<Option<Result<()>>>> {
    let failed = io(format!("writing {} projection cache rows", round.len()));
    let statement = match lock {
        Lock::Skip => client.prepare_cached(put_statement!("SKIP LOCKED")).await,
        Lock::Wait => client.prepare_cached(put_statement!("")).await,
    }
    .map_err(&failed)?;
    let units: Vec<&str> = round.iter().map(|&i| &*requests[i].unit).collect();
    let sessions: Vec<uuid::Uuid> = round.iter().map(|&i| uuid_of(requests[i].id)).collect();
    let rows: Vec<&[u8]> = round.iter().map(|&i| &*requests[i].row).collect();
    let epochs: Vec<Option<i64>> = round.iter().map(|&i| requests[i].epoch).collect();
    let mut outcomes: Vec<Option<Option<Result<()>>>> = vec![None; round.len()];
    for row in client
        .query(&statement, &[&units, &sessions, &rows, &epochs])
        .await
        .map_err(&failed)?
    {
        // `WITH ORDINALITY` counts from 1, in the order the arrays were sent.
        let ordinal: i64 = row.get(0);
        let (landed, held): (bool, bool) = (row.get(1), row.get(2));
        let index = usize::try_from(ordinal - 1)
            .ok()
            .filter(|index| *index < round.len())
            .ok_or_else(|| SubagentError::bug("a cache write's ordinal is out of its batch"))?;
        outcomes[index] = Some(match (landed, held) {
            (true, _) => Some(Ok(())),
            // Held by another transaction: written again alone, waiting for it.
            (false, true) if lock == Lock::Skip => None,
            (false, _) => Some(Err(lease_lost(requests[round[index]].id))),
        });
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome
                .ok_or_else(|| SubagentError::bug("a cache write's row is missing from its batch"))
        })
        .collect()
}
