//! Lease grants, many sessions to a transaction (see [`batch`](super::batch)).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::Pool;

use super::batch::Lock;
use super::lease_book::LeaseBook;
use super::pool::{checkout, Pooled};
use super::{io, lease_live, pool_io, seq_column, seq_value, uuid_of};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::store::lease::{Lease, LeaseEpoch, LeaseHolder};
use crate::store::not_found;

/// One session's lease asked for by one holder.
#[derive(Debug, Clone)]
pub(super) struct LeaseRequest {
    pub(super) id: SessionId,
    pub(super) holder: LeaseHolder,
}

/// A lease granted, with the length of the session's stored log when it was granted: no one
/// else appends while the lease is held, so a resume that read that much reads nothing more.
pub(super) struct Granted {
    pub(super) lease: Lease,
    pub(super) stored_len: u64,
}

/// A session's row as the grants see it: its epoch, its log's length and who holds its lease.
struct Held {
    epoch: i64,
    next_seq: i64,
    /// The holder, the node incarnation it holds for, and whether its lease is live.
    lease: Option<(uuid::Uuid, Option<uuid::Uuid>, bool)>,
}

/// One granted lease's row.
struct Grant {
    holder: uuid::Uuid,
    epoch: i64,
    row_ttl: f64,
    incarnation: Option<uuid::Uuid>,
}

/// Grants `requests` in one transaction, each as if asked alone and in order: a session's
/// lease goes to its first asker unless another live holder holds it, and a holder that asks
/// again gets a newer epoch. The sessions' rows are locked in id order, so concurrent batches
/// never deadlock on each other. A session whose row (or lease row) another transaction holds
/// is skipped by the batch's transaction and granted after it, with the others skipped,
/// waiting for their rows: a row held past the statement timeout fails the grants of the
/// sessions contended with it, not the batch's.
///
/// # Errors
/// `STORE_IO` for the batch's transaction (every request fails with it), or for the contended
/// sessions' (theirs fail with it). Per request: `SESSION_NOT_FOUND`, `SESSION_LEASED`.
pub(super) async fn grant_many(
    pool: &Pool,
    book: &LeaseBook,
    requests: &[LeaseRequest],
) -> Result<Vec<Result<Granted>>> {
    let failed = |sessions: usize| io(format!("leasing {sessions} sessions"));
    let connection = Unfinished {
        connection: Some(
            checkout(pool)
                .await
                .map_err(pool_io("connecting to PostgreSQL for leases"))?,
        ),
        finished: AtomicBool::new(false),
    };
    let client = connection.client()?;
    let mut answers: Vec<Option<Result<Granted>>> = requests.iter().map(|_| None).collect();
    let all: Vec<usize> = (0..requests.len()).collect();
    let contended = match grant_round(client, book, requests, &all, Lock::Skip, &mut answers).await
    {
        Ok(contended) => contended,
        Err((sessions, error)) => {
            // Whatever the transaction got to, it ends here; a connection that cannot say so
            // leaves the pool (see `Unfinished`).
            if client.batch_execute("ROLLBACK").await.is_ok() {
                connection.finished();
            }
            return Err(failed(sessions)(error));
        }
    };
    // The contended sessions together, waiting for their rows: most were only held for a
    // moment (a release's lease row, a checkpoint's share lock on the session row), and one
    // transaction more for each would queue every grant behind them.
    let mut ended = true;
    if !contended.is_empty() {
        let outcome = grant_round(client, book, requests, &contended, Lock::Wait, &mut answers)
            .await
            .map_err(|(sessions, error)| failed(sessions)(error));
        if let Err(error) = outcome {
            ended = client.batch_execute("ROLLBACK").await.is_ok();
            for index in contended {
                answers[index] = Some(Err(error.clone()));
            }
        }
    }
    if ended {
        connection.finished();
    }
    let answers = super::batch::answered(answers, "a lease grant");
    for (request, answer) in requests.iter().zip(&answers) {
        if answer.is_ok() {
            book.remember(&request.holder);
        }
    }
    if ended {
        book.forget_released_holders(client).await;
    }
    Ok(answers)
}

/// Releases each `(session, epoch)` lease in `released` that is still held under that epoch,
/// in one statement (a lease taken over since, under a newer epoch, stays). A lease row
/// another transaction holds (a grant or a renewal under way) is skipped by the statement and
/// released after it, with the others skipped, waiting for their rows: a row held past the
/// statement timeout fails the releases that met it, not the batch's.
///
/// # Errors
/// `STORE_IO` for the statement (every release fails with it), or for the skipped releases'
/// (theirs fail with it).
pub(super) async fn release_many(
    pool: &Pool,
    released: &[(SessionId, LeaseEpoch)],
) -> Result<Vec<Result<()>>> {
    let mut sessions = Vec::with_capacity(released.len());
    let mut epochs = Vec::with_capacity(released.len());
    for (id, LeaseEpoch(epoch)) in released {
        sessions.push(uuid_of(*id));
        epochs.push(seq_column(*epoch)?);
    }
    let failed = |leases: usize| io(format!("releasing {leases} leases"));
    let client = checkout(pool)
        .await
        .map_err(pool_io("connecting to PostgreSQL for lease releases"))?;
    // The rows it deletes are locked first, skipping those held; a row the snapshot holds under
    // the asked epoch that was not locked is held elsewhere.
    let release = client
        .prepare_cached(
            "WITH asked AS (
                 SELECT * FROM unnest($1::uuid[], $2::bigint[]) WITH ORDINALITY
                     AS a(session, epoch, i)
             ), free AS (
                 SELECT lease.session, lease.epoch FROM subagents_leases lease
                 JOIN asked ON lease.session = asked.session AND lease.epoch = asked.epoch
                 ORDER BY lease.session FOR UPDATE OF lease SKIP LOCKED
             ), deleted AS (
                 DELETE FROM subagents_leases lease USING free
                 WHERE lease.session = free.session AND lease.epoch = free.epoch
             )
             SELECT asked.i FROM asked
             WHERE EXISTS (
                 SELECT 1 FROM subagents_leases lease
                 WHERE lease.session = asked.session AND lease.epoch = asked.epoch
             ) AND NOT EXISTS (
                 SELECT 1 FROM free
                 WHERE free.session = asked.session AND free.epoch = asked.epoch
             )",
        )
        .await
        .map_err(failed(released.len()))?;
    let held: Vec<usize> = client
        .query(&release, &[&sessions, &epochs])
        .await
        .map_err(failed(released.len()))?
        .iter()
        .filter_map(|row| usize::try_from(row.get::<_, i64>(0) - 1).ok())
        .filter(|index| *index < released.len())
        .collect();
    let mut answers: Vec<Result<()>> = released.iter().map(|_| Ok(())).collect();
    if held.is_empty() {
        return Ok(answers);
    }
    let waiting = client
        .prepare_cached(
            "DELETE FROM subagents_leases lease
             USING unnest($1::uuid[], $2::bigint[]) AS released(session, epoch)
             WHERE lease.session = released.session AND lease.epoch = released.epoch",
        )
        .await;
    let (held_sessions, held_epochs): (Vec<uuid::Uuid>, Vec<i64>) = held
        .iter()
        .map(|&index| (sessions[index], epochs[index]))
        .unzip();
    let outcome = match waiting {
        Ok(waiting) => client
            .execute(&waiting, &[&held_sessions, &held_epochs])
            .await
            .map(drop),
        Err(error) => Err(error),
    };
    if let Err(error) = outcome.map_err(failed(held.len())) {
        for index in held {
            answers[index] = Err(error.clone());
        }
    }
    Ok(answers)
}

/// A connection inside the grant's transaction. Dropped before it is finished (the batch was
/// cancelled, or its rollback failed), it leaves the pool and closes, which ends the
/// transaction on the server, rather than carry the open transaction and its row locks to
/// the connection's next user.
struct Unfinished {
    connection: Option<Pooled>,
    finished: AtomicBool,
}

impl Unfinished {
    fn client(&self) -> Result<&Pooled> {
        self.connection
            .as_ref()
            .ok_or_else(|| SubagentError::bug("a lease grant without its connection"))
    }

    /// The transaction ended: the connection may serve its next user.
    fn finished(&self) {
        self.finished.store(true, Ordering::Release);
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) {
            if let Some(connection) = self.connection.take() {
                connection.close();
            }
        }
    }
}

/// The sessions' rows locked, waiting for them or skipping those held (`$lock`).
macro_rules! lock_sessions {
    ($lock:literal) => {
        concat!(
            "SELECT id, epoch, next_seq FROM subagents_sessions WHERE id = ANY($1) ORDER BY id
             FOR UPDATE ",
            $lock
        )
    };
}

/// Their lease rows read and locked, waiting for them or skipping those held (`$lock`).
macro_rules! lock_leases {
    ($lock:literal) => {
        concat!(
            "SELECT lease.session, lease.holder, lease.incarnation, ",
            lease_live!(),
            " FROM subagents_leases lease
              LEFT JOIN subagents_nodes node ON node.node = lease.holder
              WHERE lease.session = ANY($1) ORDER BY lease.session FOR UPDATE OF lease ",
            $lock
        )
    };
}

/// One transaction granting the requests `indices` names (in order), its answers put into
/// `answers`; in two round trips: the sessions' rows are locked and their leases read (sent
/// together: the server runs them in order, so the lease rows are read after the session rows
/// are locked, by a statement that sees every grant committed before), then the grants are
/// written and committed together. With [`Lock::Skip`], a session whose row or lease row
/// another transaction holds (or that does not exist) is left out of the transaction and its
/// requests answered as contended: the indices returned, to be granted alone.
///
/// # Errors
/// The statement that failed, with how many sessions the transaction asked for; the
/// transaction is then left for the caller to roll back.
async fn grant_round(
    client: &Pooled,
    book: &LeaseBook,
    requests: &[LeaseRequest],
    indices: &[usize],
    lock: Lock,
    answers: &mut [Option<Result<Granted>>],
) -> std::result::Result<Vec<usize>, (usize, tokio_postgres::Error)> {
    let mut ids: Vec<uuid::Uuid> = indices.iter().map(|&i| uuid_of(requests[i].id)).collect();
    ids.sort_unstable();
    ids.dedup();
    let asked = ids.len();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
    let (sessions, leases, stored) = match lock {
        Lock::Skip => {
            let (lock, current, stored) = futures::try_join!(
                client.prepare_cached(lock_sessions!("SKIP LOCKED")),
                client.prepare_cached(lock_leases!("SKIP LOCKED")),
                // Read after the lease rows are locked: a lease row it finds that they skipped
                // is held by another transaction.
                client
                    .prepare_cached("SELECT session FROM subagents_leases WHERE session = ANY($1)"),
            )
            .map_err(|error| (asked, error))?;
            let ((), sessions, leases, stored) = futures::try_join!(
                client.batch_execute("BEGIN"),
                client.query(&lock, &params),
                client.query(&current, &params),
                client.query(&stored, &params)
            )
            .map_err(|error| (asked, error))?;
            (sessions, leases, Some(stored))
        }
        Lock::Wait => {
            let (lock, current) = futures::try_join!(
                client.prepare_cached(lock_sessions!("")),
                client.prepare_cached(lock_leases!("")),
            )
            .map_err(|error| (asked, error))?;
            let ((), sessions, leases) = futures::try_join!(
                client.batch_execute("BEGIN"),
                client.query(&lock, &params),
                client.query(&current, &params)
            )
            .map_err(|error| (asked, error))?;
            (sessions, leases, None)
        }
    };
    let mut held: HashMap<uuid::Uuid, Held> = sessions
        .iter()
        .map(|row| {
            (
                row.get(0),
                Held {
                    epoch: row.get(1),
                    next_seq: row.get(2),
                    lease: None,
                },
            )
        })
        .collect();
    let mut read: HashSet<uuid::Uuid> = HashSet::new();
    for row in &leases {
        let session: uuid::Uuid = row.get(0);
        if let Some(held) = held.get_mut(&session) {
            held.lease = Some((row.get(1), row.get(2), row.get(3)));
            read.insert(session);
        }
    }
    let contended: HashSet<uuid::Uuid> = match &stored {
        Some(stored) => ids
            .iter()
            .copied()
            .filter(|id| !held.contains_key(id))
            .chain(
                stored
                    .iter()
                    .map(|row| row.get::<_, uuid::Uuid>(0))
                    .filter(|session| held.contains_key(session) && !read.contains(session)),
            )
            .collect(),
        None => HashSet::new(),
    };
    held.retain(|session, _| !contended.contains(session));
    let mut grants: HashMap<uuid::Uuid, Grant> = HashMap::new();
    let mut skipped = Vec::new();
    for &index in indices {
        if contended.contains(&uuid_of(requests[index].id)) {
            skipped.push(index);
        } else {
            answers[index] = Some(grant_one(book, &requests[index], &mut held, &mut grants));
        }
    }
    let mut columns = GrantColumns::default();
    for (session, grant) in grants {
        columns.sessions.push(session);
        columns.holders.push(grant.holder);
        columns.epochs.push(grant.epoch);
        columns.ttls.push(grant.row_ttl);
        columns.incarnations.push(grant.incarnation);
    }
    let grant = client
        .prepare_cached(
            "WITH granted AS (
                 SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::float8[],
                                      $5::uuid[])
                     AS g(session, holder, epoch, ttl, incarnation)
             ), fenced AS (
                 UPDATE subagents_sessions s SET epoch = g.epoch
                 FROM granted g WHERE s.id = g.session
             )
             INSERT INTO subagents_leases (session, holder, epoch, expires_at, incarnation)
             SELECT session, holder, epoch, now() + make_interval(secs => ttl), incarnation
             FROM granted
             ON CONFLICT (session) DO UPDATE
             SET holder = excluded.holder, epoch = excluded.epoch,
                 expires_at = excluded.expires_at, incarnation = excluded.incarnation",
        )
        .await
        .map_err(|error| (asked, error))?;
    // A failed write is answered before the commit, which then ends the failed transaction.
    let written: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &columns.sessions,
        &columns.holders,
        &columns.epochs,
        &columns.ttls,
        &columns.incarnations,
    ];
    futures::try_join!(
        client.execute(&grant, &written),
        client.batch_execute("COMMIT")
    )
    .map_err(|error| (asked, error))?;
    Ok(skipped)
}

/// The granted leases' rows, column by column.
#[derive(Default)]
struct GrantColumns {
    sessions: Vec<uuid::Uuid>,
    holders: Vec<uuid::Uuid>,
    epochs: Vec<i64>,
    ttls: Vec<f64>,
    incarnations: Vec<Option<uuid::Uuid>>,
}

/// Decides one request against the rows as the requests before it in the batch left them.
fn grant_one(
    book: &LeaseBook,
    request: &LeaseRequest,
    held: &mut HashMap<uuid::Uuid, Held>,
    grants: &mut HashMap<uuid::Uuid, Grant>,
) -> Result<Granted> {
    let id = request.id;
    let session = held.get_mut(&uuid_of(id)).ok_or_else(|| not_found(id))?;
    let epoch = session
        .epoch
        .checked_add(1)
        .ok_or_else(|| SubagentError::bug("lease epoch overflow"))?;
    let holder = request.holder.id();
    let mut terms = book.lease_terms(holder, LeaseEpoch(seq_value(epoch)?));
    if let Some((other, incarnation, live)) = session.lease {
        // A node's own lease, unless another incarnation of the node took it (this process
        // was paused, and a new one joined under its id).
        let ours = other == holder && incarnation == terms.incarnation;
        if !ours && live && !book.is_gone(other) {
            return Err(SubagentError::new(
                ErrorCode::SessionLeased,
                format!("session {id} is live in another runtime (its lease is held)"),
            ));
        }
        terms.lease.taken_over = !ours;
    }
    session.epoch = epoch;
    session.lease = Some((holder, terms.incarnation, true));
    grants.insert(
        uuid_of(id),
        Grant {
            holder,
            epoch,
            row_ttl: terms.row_ttl,
            incarnation: terms.incarnation,
        },
    );
    Ok(Granted {
        lease: terms.lease,
        stored_len: seq_value(session.next_seq)?,
    })
}
