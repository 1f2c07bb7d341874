//! Provides the settlement rules every out-of-process run shares: [`settle_attempt`] turns an
//! attempt into the run's result, and [`out_of_process_run`] publishes it as a
//! [`SubagentRun`] whose disposal cancels locally and then awaits the backend's teardown.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::content::ContentBlock;
use crate::error::{Result, SubagentError};
use crate::ids::SessionId;
use crate::seam::{SubagentResult, SubagentRun};
use crate::stop_reason::StopReason;

/// The text a child has streamed so far: what an aborted or failed run reports as its output.
/// Cheap to clone; clones share the text.
#[derive(Debug, Clone, Default)]
pub struct PartialOutput {
    text: Arc<Mutex<String>>,
}

impl PartialOutput {
    /// Appends a streamed chunk.
    pub fn push(&self, chunk: &str) {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_str(chunk);
    }

    /// Replaces the text so far (a provider whose partial output is a selection, not a stream).
    pub fn set(&self, text: &str) {
        let mut held = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        held.clear();
        held.push_str(text);
    }

    /// The text so far as one text block, or no block when nothing was streamed.
    pub fn snapshot(&self) -> Vec<ContentBlock> {
        let text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        if text.is_empty() {
            Vec::new()
        } else {
            vec![ContentBlock::text(text.as_str())]
        }
    }
}

/// Settles one attempt under the shared rules:
///
/// 1. local cancellation wins: once `cancel` fires the result is `aborted` with the partial
///    output, at once, whether the attempt later succeeds or fails (the attempt is dropped, so
///    it must not own the child's teardown);
/// 2. an attempt that fails after cancellation is `aborted` too;
/// 3. any other failure is logged as `<provider>: child run failed (error): <message>` and
///    settles `error` with the partial output;
/// 4. a success passes through unchanged.
pub async fn settle_attempt(
    provider: &str,
    attempt: impl Future<Output = Result<SubagentResult>>,
    cancel: &CancellationToken,
    partial: &PartialOutput,
) -> SubagentResult {
    let aborted = || SubagentResult::with_output(StopReason::Aborted, partial.snapshot());
    let outcome = tokio::select! {
        biased;
        () = cancel.cancelled() => return aborted(),
        outcome = attempt => outcome,
    };
    match outcome {
        _ if cancel.is_cancelled() => aborted(),
        Ok(result) => result,
        Err(error) => {
            tracing::warn!(code = %error.code(), "{provider}: child run failed (error): {}", error.message());
            SubagentResult::with_output(StopReason::Error, partial.snapshot())
        }
    }
}

/// Publishes an out-of-process run: a fresh run id (never the child's protocol id), no local
/// agent, a result settled by [`settle_attempt`] in a task of its own, and a memoized disposal
/// that first cancels locally (settling a pending result `aborted` without waiting for the
/// child) and then awaits `teardown` until the child has exited.
///
/// `cancel` is the run's local cancellation: a child token of the caller's, so the caller's
/// cancellation and the disposal both reach it.
pub fn out_of_process_run<A, T>(
    provider: impl Into<String>,
    attempt: A,
    partial: PartialOutput,
    cancel: CancellationToken,
    teardown: T,
) -> SubagentRun
where
    A: Future<Output = Result<SubagentResult>> + Send + 'static,
    T: FnOnce() -> BoxFuture<'static, Result<()>> + Send + 'static,
{
    let provider = provider.into();
    let settle_cancel = cancel.clone();
    let settled =
        tokio::spawn(
            async move { settle_attempt(&provider, attempt, &settle_cancel, &partial).await },
        );
    let result = settled.map(|joined| {
        joined.map_err(|error| SubagentError::bug(format!("a run's settlement task died: {error}")))
    });
    SubagentRun::new(SessionId::new(), None, result, move || {
        cancel.cancel();
        teardown()
    })
}
