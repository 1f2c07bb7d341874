//! Projection-cache rows, many to a statement (see [`batch`](super::batch)).
//!
//! Every epoch's end and every one-shot disposal writes its session's checkpoint row: the main
//! job writes about a thousand, and one statement each made them queue behind each other on the
//! store's connections. Rows waiting together are written by one statement, each still fenced
//! by its own lease.

use std::collections::HashSet;
use std::sync::Arc;

use deadpool_postgres::Pool;

use super::{io, pool_io, seq_column, uuid_of};
use crate::error::Result;
use crate::ids::SessionId;
use crate::store::lease::{lease_lost, LeaseEpoch};

/// One projection-cache row to write: `unit`'s row of session `id`, fenced by the lease it was
/// computed under when it has one.
#[derive(Debug, Clone)]
pub(super) struct CachePut {
    pub(super) unit: Arc<str>,
    pub(super) id: SessionId,
    pub(super) row: Arc<[u8]>,
    pub(super) lease: Option<LeaseEpoch>,
}

/// Writes `puts`, each as if alone and in order: a row under a lease lands only while its
/// session's epoch is that lease's (`LEASE_LOST` for that row alone otherwise), and of two rows
/// for one unit and session, the later one is the one kept.
///
/// # Errors
/// `STORE_IO` for a statement (every row fails with it). Per row: `LEASE_LOST`.
pub(super) async fn put_many(pool: &Pool, puts: &[CachePut]) -> Result<Vec<Result<()>>> {
    let client = pool
        .get()
        .await
        .map_err(pool_io("connecting to PostgreSQL for the projection cache"))?;
    // The session rows are locked in share mode, in id order as every batch locks them: a
    // lease taken meanwhile (which moves the epoch under `FOR UPDATE`) either waits for these
    // writes or fences them out.
    let statement = client
        .prepare_cached(
            "WITH put AS (
                 SELECT * FROM unnest($1::text[], $2::uuid[], $3::bytea[], $4::bigint[])
                     AS p(unit, session, row, epoch)
             ), fence AS MATERIALIZED (
                 SELECT s.id, s.epoch FROM subagents_sessions s
                 WHERE s.id IN (SELECT session FROM put WHERE epoch IS NOT NULL)
                 ORDER BY s.id FOR SHARE
             )
             INSERT INTO subagents_projection_cache (unit, session, row)
             SELECT p.unit, p.session, p.row FROM put p LEFT JOIN fence f ON f.id = p.session
             WHERE p.epoch IS NULL OR f.epoch = p.epoch
             ON CONFLICT (unit, session) DO UPDATE SET row = excluded.row
             RETURNING unit, session",
        )
        .await
        .map_err(io("preparing a statement"))?;
    let mut answers: Vec<Option<Result<()>>> = vec![None; puts.len()];
    // A statement writes a (unit, session) row once: a row asked for twice in the batch goes
    // in the next wave, after the first.
    let mut waiting: Vec<usize> = (0..puts.len()).collect();
    while !waiting.is_empty() {
        let mut keys = HashSet::new();
        let (wave, later): (Vec<usize>, Vec<usize>) = waiting
            .into_iter()
            .partition(|&at| keys.insert((Arc::clone(&puts[at].unit), puts[at].id)));
        let mut columns = Columns::default();
        for &at in &wave {
            columns.push(&puts[at])?;
        }
        let written: HashSet<(String, uuid::Uuid)> = client
            .query(
                &statement,
                &[
                    &columns.units,
                    &columns.sessions,
                    &columns.rows,
                    &columns.epochs,
                ],
            )
            .await
            .map_err(io(format!(
                "writing {} projection cache rows",
                columns.units.len()
            )))?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        for &at in &wave {
            let put = &puts[at];
            let landed = written.contains(&(put.unit.to_string(), uuid_of(put.id)));
            answers[at] = Some(if landed || put.lease.is_none() {
                Ok(())
            } else {
                Err(lease_lost(put.id))
            });
        }
        waiting = later;
    }
    Ok(answers
        .into_iter()
        .map(|answer| answer.unwrap_or(Ok(())))
        .collect())
}

/// A wave's rows, column by column.
#[derive(Default)]
struct Columns<'a> {
    units: Vec<&'a str>,
    sessions: Vec<uuid::Uuid>,
    rows: Vec<&'a [u8]>,
    epochs: Vec<Option<i64>>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, put: &'a CachePut) -> Result<()> {
        self.units.push(&put.unit);
        self.sessions.push(uuid_of(put.id));
        self.rows.push(&put.row);
        self.epochs.push(
            put.lease
                .map(|LeaseEpoch(epoch)| seq_column(epoch))
                .transpose()?,
        );
        Ok(())
    }
}
