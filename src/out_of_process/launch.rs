//! Provides what every process provider's run is made of once its child is started: the wait
//! for its startup under a deadline ([`startup_within`]), the [`Teardown`] ladder that releases
//! the child, and [`publish`], which turns an attempt and a teardown into the consumer's
//! [`SubagentRun`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::AbortOnDropHandle;

use super::{out_of_process_run, ChildProcess, ExitOutcome, PartialOutput};
use crate::error::Result;
use crate::seam::{SubagentResult, SubagentRun};

/// How a run's child is released, at most once (by the run's disposal, or by a failed
/// startup). Dropped unrun (an abandoned start), it still ends the session task and, with the
/// last handle on the child, kills the child's tree.
pub(crate) struct Teardown {
    process: Arc<ChildProcess>,
    session: AbortOnDropHandle<()>,
    shutdown: DropGuard,
    ladder: Ladder,
}

/// How the child is asked to go.
#[derive(Debug, Clone, Copy)]
enum Ladder {
    /// Close its stdin and give it this long to exit on its own (the session included), then
    /// terminate it (ACP: a child that flushes on EOF can finish).
    EofFirst(Duration),
    /// Give the session this long to say its last words and close stdin, then terminate at
    /// once (the product providers, as in the TypeScript runtime).
    TerminateAfter(Duration),
}

impl Teardown {
    /// A teardown that closes the child's stdin and waits up to `eof_grace` for the child to
    /// exit before terminating it.
    pub(crate) fn eof_first(
        process: Arc<ChildProcess>,
        session: tokio::task::JoinHandle<()>,
        shutdown: &CancellationToken,
        eof_grace: Duration,
    ) -> Self {
        Self::new(process, session, shutdown, Ladder::EofFirst(eof_grace))
    }

    /// A teardown that gives the session up to `session_bound` to end (closing stdin), then
    /// terminates the child.
    pub(crate) fn terminate_after(
        process: Arc<ChildProcess>,
        session: tokio::task::JoinHandle<()>,
        shutdown: &CancellationToken,
        session_bound: Duration,
    ) -> Self {
        Self::new(
            process,
            session,
            shutdown,
            Ladder::TerminateAfter(session_bound),
        )
    }

    fn new(
        process: Arc<ChildProcess>,
        session: tokio::task::JoinHandle<()>,
        shutdown: &CancellationToken,
        ladder: Ladder,
    ) -> Self {
        Self {
            process,
            session: AbortOnDropHandle::new(session),
            shutdown: shutdown.clone().drop_guard(),
            ladder,
        }
    }

    /// Ends the session (closing the child's stdin), waits as the ladder says, then runs the
    /// terminate ladder (SIGTERM, grace, SIGKILL, up to [`super::process::KILLED_WITHIN`] for
    /// the tree to be gone).
    /// Returns how the child had ended before the teardown began, if it had, and how it
    /// ended.
    pub(crate) async fn run(self) -> (Option<ExitOutcome>, Option<ExitOutcome>) {
        let Self {
            process,
            mut session,
            shutdown,
            ladder,
        } = self;
        let before = process.outcome();
        drop(shutdown);
        let exited = match ladder {
            Ladder::EofFirst(grace) => tokio::time::timeout(grace, async {
                let _ = (&mut session).await;
                process.wait_for_tree_exit(None).await
            })
            .await
            .unwrap_or(false),
            Ladder::TerminateAfter(bound) => {
                let _ = tokio::time::timeout(bound, &mut session).await;
                false
            }
        };
        session.abort();
        if !exited {
            process.terminate().await;
        }
        let after = process.outcome();
        tracing::debug!(pid = process.pid(), outcome = %after.unwrap_or_default(), "child released");
        (before, after)
    }
}

/// Publishes a run whose result is `attempt` (settled by the shared rules) and whose disposal
/// runs `teardown`.
pub(crate) fn publish(
    provider: String,
    attempt: impl Future<Output = Result<SubagentResult>> + Send + 'static,
    partial: PartialOutput,
    local: CancellationToken,
    teardown: Teardown,
) -> SubagentRun {
    out_of_process_run(provider, attempt, partial, local, move || {
        async move {
            teardown.run().await;
            Ok(())
        }
        .boxed()
    })
}

/// How a child's startup wait ended.
pub(crate) enum Startup<T> {
    /// The session task answered.
    Answered(T),
    /// The caller cancelled first.
    Cancelled,
    /// The startup deadline passed first: the child never finished its handshake.
    TimedOut,
}

/// Waits for `started` (the session task's answer to the handshake), the caller's `cancel`, or
/// `limit`, whichever comes first: a child that never answers its handshake cannot hold the
/// start, and with it the caller, forever.
pub(crate) async fn startup_within<T>(
    cancel: &CancellationToken,
    limit: Duration,
    started: impl Future<Output = T>,
) -> Startup<T> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Startup::Cancelled,
        answered = tokio::time::timeout(limit, started) => match answered {
            Ok(answered) => Startup::Answered(answered),
            Err(_) => Startup::TimedOut,
        },
    }
}
