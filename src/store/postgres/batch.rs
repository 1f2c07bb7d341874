//! Provides [`Batcher`]: concurrent store calls of one kind answered by one statement.
//!
//! # Why
//! A burst of cold resumes (a parent following up on hundreds of settled children at once)
//! asks for hundreds of logs and leases together. One statement per call, each waiting for a
//! connection behind every other, makes every call wait for the whole burst's work: on a busy
//! server the round trips, not the rows, are the cost. A batcher answers every call waiting
//! when one of its slots frees with one statement (one transaction for leases), so a burst
//! costs a few round trips and a lone call costs what it did. Its slots use connections of
//! their own, so these short calls never queue behind the store's appends.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::reconnect::connection_lost;
use crate::error::{Result, SubagentError};

/// The most calls one statement answers.
const MAX_BATCH: usize = 256;

/// Answers a batch of calls, one result per call and in their order.
type Run<Req, Resp> = Arc<dyn Fn(Vec<Req>) -> BoxFuture<'static, Vec<Result<Resp>>> + Send + Sync>;

/// A call waiting for its batch.
type Waiting<Req, Resp> = (Req, oneshot::Sender<Result<Resp>>);

/// Batches concurrent calls: a task on the store's runtime takes every call waiting whenever
/// one of its `slots` is free and runs them together.
pub(super) struct Batcher<Req, Resp> {
    calls: mpsc::UnboundedSender<Waiting<Req, Resp>>,
    run: Run<Req, Resp>,
    counts: Arc<Counts>,
}

/// How many calls a batcher answered, and in how many batches.
#[derive(Debug, Default)]
struct Counts {
    calls: AtomicU64,
    batches: AtomicU64,
}

impl<Req: Clone + Send + 'static, Resp: Send + 'static> Batcher<Req, Resp> {
    /// Starts the batching task on `runtime`: at most `slots` batches run at once, each
    /// answered by `run` (one result per call, in order).
    pub(super) fn start<F, Fut>(runtime: &tokio::runtime::Handle, slots: usize, run: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Result<Resp>>> + Send + 'static,
    {
        let counts = Arc::new(Counts::default());
        let run: Run<Req, Resp> = {
            let counts = Arc::clone(&counts);
            Arc::new(move |calls| {
                counts.batches.fetch_add(1, Ordering::Relaxed);
                Box::pin(run(calls))
            })
        };
        let (calls, waiting) = mpsc::unbounded_channel();
        runtime.spawn(batching(
            waiting,
            Arc::new(Semaphore::new(slots.max(1))),
            Arc::clone(&run),
        ));
        Self { calls, run, counts }
    }

    /// How many calls were made, and how many batches (statements or transactions) answered
    /// them.
    pub(super) fn counts(&self) -> (u64, u64) {
        (
            self.counts.calls.load(Ordering::Relaxed),
            self.counts.batches.load(Ordering::Relaxed),
        )
    }

    /// Answers `request` in the next batch. A call whose batching task is gone (the store's
    /// runtime stopped) runs alone, here.
    pub(super) async fn call(&self, request: Req) -> Result<Resp> {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        if self.calls.send((request.clone(), answer)).is_ok() {
            if let Ok(result) = answered.await {
                return result;
            }
        }
        (self.run)(vec![request])
            .await
            .pop()
            .unwrap_or_else(|| Err(SubagentError::bug("a batch answered no call")))
    }
}

/// The batching task: waits for a call, then for a slot, then takes every call waiting.
async fn batching<Req: Send + 'static, Resp: Send + 'static>(
    mut waiting: mpsc::UnboundedReceiver<Waiting<Req, Resp>>,
    slots: Arc<Semaphore>,
    run: Run<Req, Resp>,
) {
    while let Some(first) = waiting.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        // What arrived while the slots were busy joins this batch.
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match waiting.try_recv() {
                Ok(call) => batch.push(call),
                Err(_) => break,
            }
        }
        let run = Arc::clone(&run);
        tokio::spawn(async move {
            let _slot = slot;
            let (requests, answers): (Vec<Req>, Vec<_>) = batch.into_iter().unzip();
            let mut results = run(requests).await.into_iter();
            for answer in answers {
                let result = results
                    .next()
                    .unwrap_or_else(|| Err(SubagentError::bug("a batch answered too few calls")));
                // A caller that stopped waiting has nothing to be told.
                let _ = answer.send(result);
            }
        });
    }
}

/// Splits the calls `waiting` (indices into a batch) into one statement's round, the first
/// asker of each key in key order (rows are then locked in one order by every batch, so two
/// batches never deadlock), and the rest in their order, for the rounds after it.
pub(super) fn first_askers<K: Ord>(
    waiting: Vec<usize>,
    key: impl Fn(usize) -> K,
) -> (Vec<usize>, Vec<usize>) {
    let mut round: Vec<usize> = Vec::with_capacity(waiting.len());
    let mut later = Vec::new();
    for index in waiting {
        if round.iter().any(|&taken| key(taken) == key(index)) {
            later.push(index);
        } else {
            round.push(index);
        }
    }
    round.sort_by_key(|&index| key(index));
    (round, later)
}

/// How a round's statement takes the rows it locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// Skips a row another transaction holds: the call is answered `None`, to be asked again
    /// alone with [`Lock::Wait`] (a row held past the statement timeout then fails its own
    /// call, not its batch's).
    Skip,
    /// Waits for every row.
    Wait,
}

/// Answers a batch's `calls` in rounds: each round is the first asker of each key
/// ([`first_askers`]), run by `round` with [`Lock::Skip`]; each call it skipped (its row held
/// elsewhere) is run again alone with [`Lock::Wait`] before the next round, so a row held past
/// the statement timeout fails its own call only. When a later round fails, the earlier
/// rounds' answers stand (they committed) and every call not yet answered fails with it; a lost
/// connection instead fails the whole batch, which is then sent again. `what` names a call in
/// the bug a skipped alone call would be.
///
/// # Errors
/// A statement's failure, when no call was answered before it or its connection was lost.
pub(super) async fn in_rounds<K, T, Fut>(
    calls: usize,
    key: impl Fn(usize) -> K,
    what: &str,
    round: impl Fn(Vec<usize>, Lock) -> Fut,
) -> Result<Vec<Result<T>>>
where
    K: Ord,
    T: Clone,
    Fut: Future<Output = Result<Vec<Option<Result<T>>>>>,
{
    let mut answers: Vec<Option<Result<T>>> = vec![None; calls];
    let mut waiting: Vec<usize> = (0..calls).collect();
    while !waiting.is_empty() {
        let (asked, later) = first_askers(waiting, &key);
        let mut contended = Vec::new();
        match round(asked.clone(), Lock::Skip).await {
            Ok(outcomes) => {
                for (index, outcome) in asked.iter().zip(outcomes) {
                    match outcome {
                        Some(outcome) => answers[*index] = Some(outcome),
                        None => contended.push(*index),
                    }
                }
            }
            Err(error) if answers.iter().any(Option::is_some) && !connection_lost(&error) => {
                for index in asked.into_iter().chain(later) {
                    answers[index] = Some(Err(error.clone()));
                }
                break;
            }
            Err(error) => return Err(error),
        }
        // Before the key's next call in this batch, if any.
        for index in contended {
            answers[index] = Some(match round(vec![index], Lock::Wait).await {
                Ok(mut alone) => alone.pop().flatten().unwrap_or_else(|| {
                    Err(SubagentError::bug(format!(
                        "{what} waiting for its row was skipped"
                    )))
                }),
                Err(error) if !connection_lost(&error) => Err(error),
                Err(error) => return Err(error),
            });
        }
        waiting = later;
    }
    Ok(answered(answers, what))
}

/// Each call's answer once a batch's rounds are over; one left unanswered is a bug, named
/// after `what` the calls are.
pub(super) fn answered<T>(answers: Vec<Option<Result<T>>>, what: &str) -> Vec<Result<T>> {
    answers
        .into_iter()
        .map(|answer| {
            answer.unwrap_or_else(|| Err(SubagentError::bug(format!("{what} went unanswered"))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn calls_waiting_for_a_slot_are_answered_together_in_order() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let run: Run<u32, u32> = {
            let sizes = Arc::clone(&sizes);
            let gate = Arc::clone(&gate);
            Arc::new(move |calls: Vec<u32>| {
                let sizes = Arc::clone(&sizes);
                let gate = Arc::clone(&gate);
                Box::pin(async move {
                    sizes.lock().unwrap().push(calls.len());
                    if calls == [0] {
                        // The first batch holds the only slot while the others arrive.
                        gate.notified().await;
                    }
                    calls.into_iter().map(|call| Ok(call * 10)).collect()
                })
            })
        };
        let (calls, waiting) = mpsc::unbounded_channel();
        let ask = |call: u32| {
            let (answer, answered) = oneshot::channel();
            calls.send((call, answer)).unwrap();
            answered
        };
        let first = ask(0);
        tokio::spawn(batching(waiting, Arc::new(Semaphore::new(1)), run));
        while sizes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let rest: Vec<_> = (1..=5).map(ask).collect();
        gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 0);
        for (call, answered) in (1..=5).zip(rest) {
            assert_eq!(answered.await.unwrap().unwrap(), call * 10);
        }
        assert_eq!(*sizes.lock().unwrap(), vec![1, 5]);
    }

    // A key asked twice waits for the next round, behind its first asker; a round is in key
    // order, whatever order the calls came in.
    #[test]
    fn a_round_takes_each_keys_first_asker_in_key_order() {
        let keys = [5, 3, 5, 1, 3];
        let (round, later) = first_askers((0..keys.len()).collect(), |index| keys[index]);
        assert_eq!(round, [3, 1, 0]);
        assert_eq!(later, [2, 4]);
        let (round, later) = first_askers(later, |index| keys[index]);
        assert_eq!((round, later), (vec![4, 2], vec![]));
    }

    #[tokio::test]
    async fn a_call_whose_batching_task_is_gone_runs_alone() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batcher = Batcher::start(runtime.handle(), 1, |calls: Vec<u32>| async move {
            calls.into_iter().map(|call| Ok(call + 1)).collect()
        });
        runtime.shutdown_background();
        assert_eq!(batcher.call(41).await.unwrap(), 42);
    }
}
