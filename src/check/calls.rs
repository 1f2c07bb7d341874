//! Provides [`Ctx`]: the calls a schedule's operations make through the public API — starts,
//! one-shot runs, follow-ups — each letting go of its future as the operation says, and each
//! answer written into the [`SharedBook`] (an unexplained refusal as an anomaly).

use std::future::Future;
use std::sync::Arc;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;

use super::book::{Child, SharedBook};
use super::model::{hold_marker, CheckModel};
use super::schedule::LetGo;
use crate::actors::agent::AgentRef;
use crate::content::{ContentBlock, MessageSource};
use crate::error::{ErrorCode, Result, SubagentError};
use crate::host::{AgentOptions, Budget};
use crate::ids::SessionId;
use crate::runtime::Runtime;
use crate::seam::{ContinuableStartSpec, FollowupOptions, SubagentStartRequest};

/// What a background operation needs.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) rt: Runtime,
    pub(super) book: SharedBook,
    pub(super) model: CheckModel,
    /// The roots' options, at creation and at every resume (their paging, say).
    pub(super) root_options: AgentOptions,
    /// The runtime's worker threads, at every reopening.
    pub(super) workers: usize,
}

/// An operation's answer, or that the caller let go of it.
enum Answer<T> {
    Ok(T),
    Err(SubagentError),
    Unknown,
}

impl<T> From<Result<T>> for Answer<T> {
    fn from(outcome: Result<T>) -> Self {
        match outcome {
            Ok(value) => Self::Ok(value),
            Err(error) => Self::Err(error),
        }
    }
}

pub(super) async fn yields(count: u8) {
    for _ in 0..count {
        tokio::task::yield_now().await;
    }
}

/// Runs `future` as the caller would: awaiting it, firing `token` after some turns, or
/// dropping it after some turns.
async fn let_go<T>(
    let_go: LetGo,
    token: CancellationToken,
    future: impl Future<Output = Result<T>>,
) -> Answer<T> {
    match let_go {
        LetGo::Never => future.await.into(),
        LetGo::Cancel(turns) => {
            tokio::spawn(async move {
                yields(turns).await;
                token.cancel();
            });
            future.await.into()
        }
        LetGo::Drop(turns) => {
            tokio::select! {
                biased;
                outcome = future => outcome.into(),
                () = yields(turns) => Answer::Unknown,
            }
        }
    }
}

/// The refusals any operation may meet in a healthy schedule; with store faults, also those a
/// failed or lost write explains.
fn refusal_expected(code: ErrorCode, faults: bool) -> bool {
    matches!(
        code,
        ErrorCode::Draining
            | ErrorCode::Unauthorized
            | ErrorCode::ActivationClosing
            | ErrorCode::AgentDisposed
            | ErrorCode::Cancelled
            | ErrorCode::AbortedBeforePublication
            | ErrorCode::BudgetExhausted
            | ErrorCode::ParentUnavailable
            | ErrorCode::DuplicateAgent
    ) || (faults
        && matches!(
            code,
            ErrorCode::StoreIo
                | ErrorCode::AgentFaulted
                | ErrorCode::PersistenceUnavailable
                | ErrorCode::ActivationTeardownFailed
                | ErrorCode::NotResumable
                | ErrorCode::SessionNotFound
        ))
}

pub(super) fn text(value: String) -> Vec<ContentBlock> {
    vec![ContentBlock::text(value)]
}

impl Ctx {
    /// Notes `error` from `what`, an anomaly unless it is a refusal the schedule explains.
    pub(super) fn refused(&self, what: &str, error: &SubagentError) {
        tracing::debug!(target: "subagents::check", %error, "{what} was refused");
        let mut book = self.book.lock();
        if !refusal_expected(error.code(), book.faults_seen) {
            book.anomaly("unexpected-error", format!("{what}: {error}"));
        }
    }

    /// A prompt `what`, held at a new gate when `hold`. Made when the operation is applied,
    /// not when its future first runs: a background operation's gate exists before a later
    /// `release` (or the release of every gate as a schedule settles) could miss it.
    pub(super) fn prompt(&self, what: &str, hold: bool) -> Vec<ContentBlock> {
        text(match hold {
            true => format!("{what} {}", hold_marker(self.model.new_gate())),
            false => what.to_owned(),
        })
    }

    pub(super) async fn start(
        self,
        parent: AgentRef,
        depth: u8,
        fork: bool,
        prompt: Vec<ContentBlock>,
        budget: Option<u8>,
        how: LetGo,
    ) {
        let token = CancellationToken::new();
        let provider = if fork { "fork" } else { "spawn" };
        let mut spec = ContinuableStartSpec::new(provider, "checked child", &parent, prompt)
            .cancel(token.clone());
        if let Some(turns) = budget {
            spec = spec.budget(Budget::unlimited().turns(u64::from(turns)));
        }
        let started = self.rt.subagents().start_continuable(spec);
        match let_go(how, token, started).await {
            Answer::Ok(started) => {
                tracing::debug!(target: "subagents::check", child = %started.child_id, parent = %parent.id(), message = %started.message_id, "started");
                let mut book = self.book.lock();
                book.children.push(Child {
                    id: started.child_id,
                    parent: parent.id(),
                    depth,
                });
                book.accept(started.message_id, started.child_id, true);
            }
            Answer::Err(error) => self.refused("a start", &error),
            Answer::Unknown => {
                *self
                    .book
                    .lock()
                    .unknown_starts
                    .entry(parent.id())
                    .or_default() += 1;
            }
        }
    }

    /// A one-shot child of `parent`: started, its result awaited, disposed. Whatever the
    /// caller lets go of, the run disposes of itself (checked as the schedule settles:
    /// [`super::driver::World`]'s left-behind check).
    pub(super) async fn one_shot(
        self,
        parent: AgentRef,
        fork: bool,
        prompt: Vec<ContentBlock>,
        how: LetGo,
    ) {
        let token = CancellationToken::new();
        let provider = if fork { "fork" } else { "spawn" };
        let mut request = SubagentStartRequest::new(&parent, prompt);
        request.cancel = token.clone();
        let started = self.rt.subagents().start(provider, request);
        let book = self.book.clone();
        let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let run = {
            let answered = Arc::clone(&answered);
            async move {
                let run = started.await?;
                answered.store(true, std::sync::atomic::Ordering::Relaxed);
                book.lock().one_shots.insert(run.id());
                let result = run.result().await;
                // A failed release is the run's answer: its result was already delivered.
                run.dispose().await?;
                result
            }
        };
        match let_go(how, token, run).await {
            Answer::Ok(result) => {
                tracing::debug!(target: "subagents::check", parent = %parent.id(), stop = ?result.stop_reason, "one-shot settled");
            }
            Answer::Err(error) => self.refused("a one-shot run", &error),
            // A start let go of before its answer may have made a child the checker cannot
            // name.
            Answer::Unknown if !answered.load(std::sync::atomic::Ordering::Relaxed) => {
                *self
                    .book
                    .lock()
                    .unknown_starts
                    .entry(parent.id())
                    .or_default() += 1;
            }
            Answer::Unknown => {}
        }
    }

    /// Sends `prompts` to `child` together, one follow-up each.
    #[expect(
        clippy::too_many_arguments,
        reason = "one operation's whole description"
    )]
    pub(super) async fn followups(
        self,
        sender: AgentRef,
        child: SessionId,
        prompts: Vec<Vec<ContentBlock>>,
        raise: bool,
        how: LetGo,
        entitled: bool,
        sequential: bool,
    ) {
        let burst = prompts.len();
        let sends = prompts.into_iter().map(|prompt| {
            let token = CancellationToken::new();
            let mut options = FollowupOptions::new(MessageSource::User).cancel(token.clone());
            if raise {
                options = options.budget(Budget::unlimited().turns(64));
            }
            let sent = self
                .rt
                .subagents()
                .followup(&sender, child, prompt, options);
            let_go(how, token, sent)
        });
        let answers = join_all(sends).await;
        for answer in answers {
            match answer {
                Answer::Ok(message) if !entitled => self.book.lock().anomaly(
                    "authority",
                    format!(
                        "a follow-up to {child} from {} (not its live parent) was accepted as {message}",
                        sender.id()
                    ),
                ),
                Answer::Ok(message) => {
                    tracing::debug!(target: "subagents::check", %child, %message, "follow-up accepted");
                    self.book
                        .lock()
                        .accept(message, child, sequential && burst == 1)
                }
                Answer::Err(error) => self.refused("a follow-up", &error),
                Answer::Unknown => {}
            }
        }
    }
}
