//! Session creations, many sessions to a statement (see [`batch`](super::batch)).
//!
//! A burst of starts (a parent delegating to hundreds of children at once) creates hundreds of
//! sessions together. One statement per creation made each wait for a connection behind every
//! other and cost the server a statement's overhead each; a batch creates every session
//! waiting in one statement, each with its seed and first lease.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Pool;

use super::lease_book::LeaseBook;
use super::pool::checkout;
use super::reconnect::Attempt;
use super::{io, pool_io};
use crate::error::Result;

/// One session to create: its row, its seed and, with a holder, its first lease. The bytes
/// are shared: a batched call keeps a copy of its request.
#[derive(Debug, Clone)]
pub(super) struct CreationRequest {
    pub(super) id: uuid::Uuid,
    pub(super) parent: Option<uuid::Uuid>,
    pub(super) header: Arc<[u8]>,
    pub(super) next_seq: i64,
    pub(super) epoch: i64,
    /// The seed's events, encoded as one batch; none for a session created empty.
    pub(super) seed: Option<Arc<[u8]>>,
    pub(super) first_seq: i64,
    /// The first lease's holder, its row's time-to-live in seconds, and the node incarnation
    /// that keeps it live (a member's lease).
    pub(super) holder: Option<uuid::Uuid>,
    pub(super) row_ttl: f64,
    pub(super) incarnation: Option<uuid::Uuid>,
}

/// Creates `requests` in one statement, each as if asked alone and in order: a session is
/// created by its first asker (`true`), and `false` answers a session that exists already,
/// a later asker of the same id among them included. On an attempt after a lost connection,
/// a session stored with exactly the asker's header is taken for the lost attempt's own.
///
/// # Errors
/// `STORE_IO` for the statement (every request fails with it).
pub(super) async fn create_many(
    pool: &Pool,
    book: &LeaseBook,
    requests: &[CreationRequest],
    attempt: Attempt,
) -> Result<Vec<Result<bool>>> {
    // The first asker of each id, in id order: rows are locked in one order by every batch,
    // so two batches asking for the same sessions never deadlock.
    let mut seen = HashSet::with_capacity(requests.len());
    let mut firsts: Vec<&CreationRequest> = requests
        .iter()
        .filter(|request| seen.insert(request.id))
        .collect();
    firsts.sort_unstable_by_key(|request| request.id);
    let failed = io(format!("creating {} sessions", firsts.len()));
    let client = checkout(pool)
        .await
        .map_err(pool_io("connecting to PostgreSQL for creations"))?;
    // One statement: each session, its seed and its first lease stand or fall together (the
    // batches' and leases' references are checked at the statement's end).
    let statement = client
        .prepare_cached(
            "WITH asked AS (
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bytea[], $4::bigint[],
                                      $5::bigint[], $6::bytea[], $7::bigint[], $8::uuid[],
                                      $9::float8[], $10::uuid[])
                     AS a(id, parent, header, next_seq, epoch, seed, first_seq, holder, ttl,
                          incarnation)
             ), created AS (
                 INSERT INTO subagents_sessions (id, parent, header, next_seq, epoch)
                 SELECT id, parent, header, next_seq, epoch FROM asked ORDER BY id
                 ON CONFLICT (id) DO NOTHING
                 RETURNING id
             ), seeded AS (
                 INSERT INTO subagents_event_batches (session, first_seq, events)
                 SELECT a.id, a.first_seq, a.seed FROM asked a JOIN created USING (id)
                 WHERE a.seed IS NOT NULL
             ), leased AS (
                 INSERT INTO subagents_leases (session, holder, epoch, expires_at, incarnation)
                 SELECT a.id, a.holder, 1, now() + make_interval(secs => a.ttl), a.incarnation
                 FROM asked a JOIN created USING (id) WHERE a.holder IS NOT NULL
             )
             SELECT id FROM created",
        )
        .await
        .map_err(&failed)?;
    let ids: Vec<uuid::Uuid> = firsts.iter().map(|request| request.id).collect();
    let parents: Vec<Option<uuid::Uuid>> = firsts.iter().map(|request| request.parent).collect();
    let headers: Vec<&[u8]> = firsts.iter().map(|request| &*request.header).collect();
    let next_seqs: Vec<i64> = firsts.iter().map(|request| request.next_seq).collect();
    let epochs: Vec<i64> = firsts.iter().map(|request| request.epoch).collect();
    let seeds: Vec<Option<&[u8]>> = firsts
        .iter()
        .map(|request| request.seed.as_deref())
        .collect();
    let first_seqs: Vec<i64> = firsts.iter().map(|request| request.first_seq).collect();
    let holders: Vec<Option<uuid::Uuid>> = firsts.iter().map(|request| request.holder).collect();
    let ttls: Vec<f64> = firsts.iter().map(|request| request.row_ttl).collect();
    let incarnations: Vec<Option<uuid::Uuid>> =
        firsts.iter().map(|request| request.incarnation).collect();
    let mut created: HashSet<uuid::Uuid> = client
        .query(
            &statement,
            &[
                &ids,
                &parents,
                &headers,
                &next_seqs,
                &epochs,
                &seeds,
                &first_seqs,
                &holders,
                &ttls,
                &incarnations,
            ],
        )
        .await
        .map_err(&failed)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    // An earlier attempt whose answer was lost may have created some of these very sessions.
    if attempt.after_loss && created.len() < firsts.len() {
        let missing: Vec<uuid::Uuid> = ids
            .iter()
            .filter(|id| !created.contains(id))
            .copied()
            .collect();
        let stored = client
            .query(
                "SELECT id, header FROM subagents_sessions WHERE id = ANY($1)",
                &[&missing],
            )
            .await
            .map_err(&failed)?;
        for row in &stored {
            let id: uuid::Uuid = row.get(0);
            let header: &[u8] = row.get(1);
            if firsts
                .iter()
                .any(|request| request.id == id && *request.header == *header)
            {
                created.insert(id);
            }
        }
    }
    if firsts.iter().any(|request| request.holder.is_some()) {
        book.forget_released_holders(&client).await;
    }
    // Each id's first asker (in the callers' order) gets its answer; a later one finds the
    // session there.
    let mut answered = HashSet::with_capacity(requests.len());
    Ok(requests
        .iter()
        .map(|request| Ok(answered.insert(request.id) && created.contains(&request.id)))
        .collect())
}
