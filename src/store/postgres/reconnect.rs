//! Provides [`PostgresStore::reconnecting`]: a store call that outlives a lost connection.
//!
//! # Why
//! A terminated backend (`pg_terminate_backend`, an idle-session timeout) or a server restart
//! ends every connection the pool holds. The next call on each fails, and a failed session
//! write faults its agent. A lost connection is a passing fault: the call is tried again on a
//! fresh connection, with a bounded backoff, for up to [`RECONNECT_WITHIN`]. Only what is
//! idempotent is retried as is; a call whose first attempt may have committed before its
//! answer was lost is told so (`Attempt::after_loss`) and settles that ambiguity itself (an
//! append finds its own batch stored, a creation its own header).
//!
//! Every attempt has a deadline ([`within`]): a server that stops answering without closing
//! the connection (paused, partitioned, stuck on its disk) fails the call with `STORE_IO`
//! instead of holding its caller forever, and closes the connection the call held rather than
//! hand it to the next call, which would wait behind the unanswered statement. Such a call is
//! not tried again: the server that did not answer it would not answer the next attempt sooner.

use std::future::Future;
use std::time::Duration;

use super::PostgresStore;
use crate::error::{ErrorCode, Result, SubagentError};

/// How long a call keeps trying to reach the server again before it fails (`STORE_IO`).
pub const RECONNECT_WITHIN: Duration = Duration::from_secs(15);

/// The first wait before another attempt; it doubles up to [`BACKOFF_MAX`].
const BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait between two attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Which attempt of a call this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Attempt {
    /// Whether an earlier attempt lost its connection: it may have committed unseen.
    pub(super) after_loss: bool,
}

/// Whether `error` says the connection to the server was lost (closed, terminated, refused
/// while the server restarts), rather than that the server refused the statement.
pub(super) fn connection_lost(error: &SubagentError) -> bool {
    if error.code() != ErrorCode::StoreIo {
        return false;
    }
    let mut cause = error.cause();
    while let Some(current) = cause {
        if let Some(postgres) = current.downcast_ref::<tokio_postgres::Error>() {
            if postgres.is_closed() {
                return true;
            }
            if let Some(code) = postgres.code() {
                let code = code.code();
                // 57P01-57P03: the server is shutting down or terminated the backend; class 08:
                // connection exceptions.
                return matches!(code, "57P01" | "57P02" | "57P03") || code.starts_with("08");
            }
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind;
            return matches!(
                io.kind(),
                ErrorKind::ConnectionRefused
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotFound
            );
        }
        cause = current.source();
    }
    false
}

impl PostgresStore {
    /// Runs `call` until it answers anything but a lost connection, each attempt within the
    /// store's call deadline (see [`reconnecting`]).
    pub(super) async fn reconnecting<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        reconnecting(what, self.call_deadline, call).await
    }

    /// `call` within the store's call deadline (see [`within`]), for a call that is not tried
    /// again on a lost connection.
    pub(super) async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        within(what, self.call_deadline, call).await
    }
}

/// `call`'s answer, or `STORE_IO` once `deadline` passed without one (`NO_ACTOR_SYSTEM`
/// outside a tokio runtime, whose timer the deadline needs). A connection the call held is
/// then closed, not handed back to the pool (see [`Pooled`](super::pool::Pooled)).
pub(super) async fn within<T>(
    what: &str,
    deadline: Duration,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    super::store_runtime()?;
    super::pool::by_deadline(deadline, call)
        .await
        .unwrap_or_else(|| {
            tracing::warn!(?deadline, "{what}: PostgreSQL did not answer in time");
            Err(SubagentError::new(
                ErrorCode::StoreIo,
                format!("{what}: PostgreSQL did not answer within {deadline:?}"),
            ))
        })
}

/// Runs `call` until it answers anything but a lost connection, waiting a bounded backoff
/// between attempts, for at most [`RECONNECT_WITHIN`]; the last error past that. Each attempt
/// waits at most `each` for its answer ([`within`]).
pub(super) async fn reconnecting<T, F, Fut>(what: &str, each: Duration, mut call: F) -> Result<T>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + RECONNECT_WITHIN;
    let mut backoff = BACKOFF;
    let mut attempt = Attempt { after_loss: false };
    loop {
        match within(what, each, call(attempt)).await {
            Err(error) if connection_lost(&error) => {
                if tokio::time::Instant::now() + backoff >= deadline {
                    return Err(error);
                }
                tracing::warn!(%error, ?backoff, "{what}: the connection to PostgreSQL was lost; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                attempt.after_loss = true;
            }
            outcome => return outcome,
        }
    }
}
