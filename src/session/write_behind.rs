//! Provides the write-behind of an attached [`SessionLog`]: the log's half
//! ([`WriteBehind`]: watermarks, waiting barriers, the fault hook) and the per-session [`Writer`]
//! task that appends what the log committed to the store, flushes for durable barriers, renews
//! the session's lease, and faults the log when a durable write fails. A writer with nothing to
//! do and no lease to renew parks in its log instead of waiting as a task, and the log's next
//! append, barrier or close starts it again; a short-lived session's writer waits as a task
//! instead ([`WriterIdle`]). A delegated child's session may be attached before it is stored:
//! its creation is deferred until it commits ([`CreationCommit`]), and the writer's first write
//! then stores the whole session at once. The guarantees are stated in [`crate::session::log`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::event::{EventKind, SessionEvent};
use crate::session::header::SessionHeader;
use crate::session::log::{len_of, lock_state, LogInner, LogState, SessionLog};
use crate::store::{Lease, LeaseHolder, SharedStore};

/// How many committed events may wait for the store before producers wait for room.
pub const WRITE_BEHIND_LIMIT: u64 = 4096;

/// The most events one store append carries.
const MAX_BATCH: u64 = 1024;

/// Told once, with the error, when the log faults.
pub(crate) type FaultHook = Box<dyn FnOnce(SubagentError) + Send>;

/// When a deferred creation commits: until then nothing of the session is in the store, and a
/// close discards it, so a creation that is refused or rolled back leaves nothing behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreationCommit {
    /// With the first message its inbox accepts: a continuable child exists once its prompt is
    /// accepted, and the session is stored with that acceptance in it.
    FirstAcceptance,
    /// When [`crate::session::SessionLog::commit_creation`] is called: a one-shot child commits
    /// at its first entered step, with the descriptor that names it.
    Explicit,
}

impl CreationCommit {
    /// Whether appending `kind` commits the creation.
    fn fires_on(self, kind: &EventKind) -> bool {
        match self {
            Self::FirstAcceptance => matches!(
                kind,
                EventKind::InboxSpliced { inserted, .. } if !inserted.is_empty()
            ),
            Self::Explicit => false,
        }
    }
}

/// Where an attached session's creation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Creation {
    /// In the store: later events are appended.
    Stored,
    /// Attached before it is stored, waiting for its commit: nothing is written.
    Waiting(CreationCommit),
    /// Committed: the writer's next write stores the session whole.
    Committed,
}

/// Where an attached log's session stands in the store.
pub(crate) enum Attachment {
    /// Stored: events from `next_seq` on are appended, under `lease`.
    Stored { next_seq: u64, lease: Option<Lease> },
    /// Not stored yet: the first write, once the creation commits, stores the header and every
    /// event so far and takes the session's lease for `holder`.
    Deferred {
        commit: CreationCommit,
        holder: LeaseHolder,
        /// The log the session's seed is stored by reference into, whose prefix the creation
        /// waits to see written.
        seed_source: Option<SessionLog>,
    },
}

/// The attached log's half of write-behind; the writer task holds the other.
pub(super) struct WriteBehind {
    /// Events below this seq are in the store.
    pub(super) written: u64,
    /// Events below this seq are durable (a store flush covered them).
    pub(super) durable: u64,
    pub(super) barriers: Vec<Barrier>,
    /// Shared with the writer.
    pub(super) signals: Arc<Signals>,
    /// Set by [`SessionLog::close`]: write what is left, release the lease, stop.
    pub(super) closing: Option<oneshot::Sender<Result<()>>>,
    pub(super) closing_requested: bool,
    pub(super) on_fault: Option<FaultHook>,
    /// The writer, while it has nothing to do and no lease to renew: it waits here rather than
    /// as a task, so an idle session holds no task (a million resident children would hold a
    /// million). The next thing for it to do starts it again.
    pub(super) parked: Option<Box<Parked>>,
    /// Whether the session is in the store yet.
    pub(super) creation: Creation,
}

impl WriteBehind {
    /// Notes an event the log just committed: it may commit a deferred creation.
    pub(super) fn appending(&mut self, kind: &EventKind) {
        if let Creation::Waiting(commit) = self.creation {
            if commit.fires_on(kind) {
                self.creation = Creation::Committed;
            }
        }
    }

    /// Events below `written` are in the store: producers waiting for room go on, and every
    /// drain they satisfy is answered now, before a later write can fail under it.
    fn wrote(&mut self, written: u64) {
        self.written = written;
        self.signals.room.notify_waiters();
        answer_barriers(&mut self.barriers, |barrier| {
            (!barrier.durable && barrier.target <= written).then_some(Ok(()))
        });
    }

    /// Whether the session is not stored yet and nothing commits it for now: nothing is written.
    pub(super) fn uncommitted(&self) -> bool {
        matches!(self.creation, Creation::Waiting(_))
    }

    /// Tells the writer there is something to do: wakes it, or hands back the parked writer,
    /// which the caller resumes once it no longer holds the log's lock (a writer whose runtime
    /// has stopped is dropped at once, and its drop takes that lock).
    pub(super) fn wake(&mut self) -> Resume {
        let parked = self.parked.take();
        if parked.is_none() {
            self.signals.wake.notify_one();
        }
        Resume(parked)
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        // The last handle of the log is gone (no lock is held): let the writer notice and stop,
        // releasing its lease.
        self.wake().run();
    }
}

/// A writer waiting, outside any task, for its next work.
pub(super) struct Parked {
    writer: Writer,
    /// The runtime it ran on, where it runs again.
    runtime: tokio::runtime::Handle,
}

/// What [`WriteBehind::wake`] leaves to do once the log's lock is released: start the parked
/// writer again, if it was parked.
#[derive(Default)]
#[must_use = "a parked writer runs again only once resumed"]
pub(super) struct Resume(Option<Box<Parked>>);

impl Resume {
    /// Runs the parked writer again on its runtime; called without the log's lock held.
    pub(super) fn run(self) {
        if let Some(parked) = self.0 {
            let Parked { writer, runtime } = *parked;
            // A stopped runtime drops the task unrun; the writer's drop then ends write-behind
            // with an error, so no waiter hangs.
            drop(runtime.spawn(writer.run()));
        }
    }
}

/// The notifications between a log and its writer (one allocation for both).
#[derive(Default)]
pub(super) struct Signals {
    /// Wakes the writer.
    pub(super) wake: Notify,
    /// Wakes producers waiting for room.
    pub(super) room: Notify,
}

/// A flush or drain waiting for the writer.
pub(super) struct Barrier {
    pub(super) target: u64,
    pub(super) durable: bool,
    pub(super) reply: oneshot::Sender<Result<()>>,
}

/// What the writer does next.
enum Work {
    /// Store the deferred session whole: its header and every event so far (after a seed
    /// stored by reference).
    Create {
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    },
    Append {
        from: u64,
        batch: Vec<Arc<SessionEvent>>,
    },
    Flush {
        upto: u64,
    },
    Idle,
    Exit,
}

/// The write-behind task of one session.
pub(super) struct Writer {
    /// Weak, so a log dropped without a close still frees its memory; the writer then stops.
    pub(super) log: Weak<LogInner>,
    pub(super) store: SharedStore,
    pub(super) id: SessionId,
    pub(super) lease: Option<Lease>,
    /// Who takes the lease when a deferred creation is stored.
    pub(super) holder: Option<LeaseHolder>,
    /// The log whose prefix a deferred creation's seed references, until it is stored.
    pub(super) seed_source: Option<SessionLog>,
    pub(super) signals: Arc<Signals>,
    /// Set once write-behind has ended (see the `Drop` impl).
    pub(super) finished: AtomicBool,
    /// Whether it parks in its log when idle (see [`WriterIdle`]).
    pub(super) idle: WriterIdle,
}

/// What a writer with nothing to do and no lease to renew does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriterIdle {
    /// Parks in its log, holding no task, until the log's next append, barrier or close starts
    /// it again: for sessions that idle (a resident child between turns).
    Park,
    /// Waits as a task: for a short-lived session, which would otherwise be parked and started
    /// again (a task each time) between its few writes.
    Wait,
}

impl Writer {
    // Not an `async fn`: its argument would be kept twice in the task's state (as the captured
    // argument and as the body's local), and every attached log has this task.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn keeps its argument twice"
    )]
    pub(super) fn run(self) -> impl std::future::Future<Output = ()> + Send {
        async move {
            let mut writer = self;
            loop {
                match writer.write_until_closed().await {
                    Some(outcome) => return writer.finish(outcome),
                    None => match writer.park() {
                        Ok(()) => return,
                        Err(busy) => writer = busy,
                    },
                }
            }
        }
    }

    /// Parks this writer in its log when there is still nothing to do; gives it back when there
    /// is (or when its log is gone, for it to release the lease).
    fn park(self) -> std::result::Result<(), Self> {
        let Some(inner) = self.log.upgrade() else {
            return Err(self);
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(self);
        };
        let mut state = lock_state(&inner);
        if !matches!(next_work(&mut state), Work::Idle) {
            return Err(self);
        }
        let Some(write_behind) = state.write_behind.as_mut() else {
            return Err(self);
        };
        write_behind.parked = Some(Box::new(Parked {
            writer: self,
            runtime,
        }));
        Ok(())
    }

    /// Writes until the log closes (then releases the lease) or a durable write fails; `None`
    /// when it is idle with no lease to renew, to be parked.
    async fn write_until_closed(&mut self) -> Option<Result<()>> {
        let mut renew_at = self.renewal_after(Instant::now());
        let outcome = loop {
            if let Some(at) = renew_at.filter(|at| *at <= Instant::now()) {
                if let Err(error) = self.renew().await {
                    break Err(error);
                }
                renew_at = self.renewal_after(at);
            }
            let Some(inner) = self.log.upgrade() else {
                break Ok(());
            };
            let work = next_work(&mut lock_state(&inner));
            drop(inner);
            let step = match work {
                Work::Create { header, events } => {
                    let created = self.create(header, events).await;
                    renew_at = self.renewal_after(Instant::now());
                    created
                }
                Work::Append { from, batch } => self.append(from, batch).await,
                Work::Flush { upto } => self.flush(upto).await,
                Work::Exit => break Ok(()),
                Work::Idle => {
                    match renew_at {
                        None if self.idle == WriterIdle::Park => return None,
                        None => self.signals.wake.notified().await,
                        Some(at) => {
                            // Boxed: only a lease with a time-to-live needs the timer, and
                            // the state of every idle writer would pay for it.
                            tokio::select! {
                                () = self.signals.wake.notified() => {}
                                () = Box::pin(tokio::time::sleep_until(at)) => {}
                            }
                        }
                    }
                    Ok(())
                }
            };
            if let Err(error) = step {
                break Err(error);
            }
        };
        Some(match outcome {
            Ok(()) => self.release().await,
            Err(error) => Err(error),
        })
    }

    /// When to renew next: a third of the lease's time-to-live after `from`.
    fn renewal_after(&self, from: Instant) -> Option<Instant> {
        let ttl = self.lease?.ttl?;
        Some(from + (ttl / 3).max(Duration::from_millis(1)))
    }

    async fn renew(&self) -> Result<()> {
        let Some(lease) = self.lease else {
            return Ok(());
        };
        match self.store.renew_lease(self.id, lease.epoch).await {
            Ok(()) => Ok(()),
            Err(error) if error.code() == ErrorCode::LeaseLost => Err(error),
            Err(error) => {
                // A passing fault: try again next time. If the lease expires meanwhile, the next
                // append is refused by its fencing epoch and faults the log.
                tracing::warn!(session_id = %self.id, %error, "lease renewal failed; retrying");
                Ok(())
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let Some(lease) = self.lease else {
            return Ok(());
        };
        self.store
            .release_lease(self.id, lease.epoch)
            .await
            .inspect_err(|error| {
                tracing::warn!(session_id = %self.id, %error, "lease release failed");
            })
    }

    /// Stores a deferred session whole and takes its lease; later events are appended under it.
    async fn create(
        &mut self,
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> Result<()> {
        let holder = self
            .holder
            .take()
            .ok_or_else(|| SubagentError::bug("a deferred creation was stored twice"))?;
        let first = header.first_stored_seq();
        if let Some(source) = self.seed_source.take() {
            source.written_through(first).await?;
        }
        let count = first + u64::try_from(events.len()).unwrap_or(u64::MAX);
        let lease = self.store.create_leased(header, events, holder).await?;
        self.lease = Some(lease);
        if let Some(inner) = self.log.upgrade() {
            let mut state = lock_state(&inner);
            state.lease = std::num::NonZeroU64::new(lease.epoch.0);
            if let Some(write_behind) = state.write_behind.as_mut() {
                write_behind.creation = Creation::Stored;
                write_behind.wrote(count);
            }
        }
        Ok(())
    }

    async fn append(&self, from: u64, batch: Vec<Arc<SessionEvent>>) -> Result<()> {
        let count = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let epoch = self.lease.map(|lease| lease.epoch);
        self.store.append(self.id, from, batch, epoch).await?;
        if let Some(inner) = self.log.upgrade() {
            let mut state = lock_state(&inner);
            if let Some(write_behind) = state.write_behind.as_mut() {
                write_behind.wrote(from + count);
            }
        }
        Ok(())
    }

    async fn flush(&self, upto: u64) -> Result<()> {
        self.store.flush(self.id).await?;
        if let Some(inner) = self.log.upgrade() {
            let mut state = lock_state(&inner);
            if let Some(write_behind) = state.write_behind.as_mut() {
                write_behind.durable = write_behind.durable.max(upto);
                let durable = write_behind.durable;
                answer_barriers(&mut write_behind.barriers, |barrier| {
                    (barrier.durable && barrier.target <= durable).then_some(Ok(()))
                });
            }
        }
        Ok(())
    }

    /// Stops write-behind: answers every waiter with `outcome` and, on an error, faults the log.
    fn finish(&self, outcome: Result<()>) {
        self.finished.store(true, Ordering::Release);
        let Some(inner) = self.log.upgrade() else {
            if let Err(error) = outcome {
                tracing::error!(session_id = %self.id, %error, "write-behind of a dropped log failed");
            }
            return;
        };
        let mut state = lock_state(&inner);
        let Some(mut write_behind) = state.write_behind.take() else {
            return;
        };
        let mut hook = None;
        if let Err(error) = &outcome {
            tracing::error!(session_id = %self.id, %error, "durable write failed: the session is faulted");
            state.fault.get_or_insert_with(|| Box::new(error.clone()));
            inner.faulted.store(true, Ordering::Release);
            hook = write_behind.on_fault.take();
        }
        answer_barriers(&mut write_behind.barriers, |_| Some(outcome.clone()));
        write_behind.signals.room.notify_waiters();
        if let Some(closing) = write_behind.closing.take() {
            // The closer may have stopped waiting; the close still happened.
            let _ = closing.send(outcome.clone());
        }
        drop(state);
        if let (Some(hook), Err(error)) = (hook, outcome) {
            hook(error);
        }
    }
}

impl Drop for Writer {
    /// A writer dropped before it finished (never polled, or its thread stopped under it) ends
    /// write-behind with an error, so no barrier or closer waits for it forever. A log that is
    /// gone has no one waiting.
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) && self.log.strong_count() > 0 {
            self.finish(Err(SubagentError::new(
                ErrorCode::PersistenceUnavailable,
                "the session's write-behind stopped before the log closed",
            )));
        }
    }
}

/// What the writer does next, decided under the log lock: append what is unwritten (in
/// batches), answer the drains it satisfied, flush for a waiting durable barrier, or stop once
/// closing and done.
fn next_work(state: &mut LogState) -> Work {
    let LogState {
        header,
        events,
        write_behind,
        ..
    } = state;
    let len = len_of(events);
    let Some(write_behind) = write_behind.as_mut() else {
        return Work::Exit;
    };
    match write_behind.creation {
        Creation::Stored => {}
        Creation::Committed => {
            // A seed stored by reference is not the session's to store.
            let own = usize::try_from(header.first_stored_seq()).unwrap_or(usize::MAX);
            return Work::Create {
                header: header.clone(),
                events: events.to_vec_range(own, events.len()),
            };
        }
        Creation::Waiting(_) => {
            // Not a stored session yet: nothing of it is written, so its barriers are met at
            // once, and a close discards it.
            answer_barriers(&mut write_behind.barriers, |_| Some(Ok(())));
            return if write_behind.closing_requested {
                Work::Exit
            } else {
                Work::Idle
            };
        }
    }
    if write_behind.written < len {
        let from = write_behind.written;
        let end = len.min(from.saturating_add(MAX_BATCH));
        let start = usize::try_from(from).unwrap_or(usize::MAX);
        let stop = usize::try_from(end).unwrap_or(usize::MAX);
        return Work::Append {
            from,
            batch: events.to_vec_range(start, stop),
        };
    }
    let written = write_behind.written;
    answer_barriers(&mut write_behind.barriers, |barrier| {
        (!barrier.durable && barrier.target <= written).then_some(Ok(()))
    });
    if write_behind.barriers.iter().any(|barrier| barrier.durable) {
        return Work::Flush { upto: written };
    }
    if write_behind.closing_requested {
        return Work::Exit;
    }
    Work::Idle
}

/// Answers (and removes) every barrier for which `answer` has an outcome.
fn answer_barriers(
    barriers: &mut Vec<Barrier>,
    mut answer: impl FnMut(&Barrier) -> Option<Result<()>>,
) {
    let mut index = 0;
    while index < barriers.len() {
        match answer(&barriers[index]) {
            Some(outcome) => {
                let barrier = barriers.swap_remove(index);
                // A waiter that stopped listening needs no answer.
                let _ = barrier.reply.send(outcome);
            }
            None => index += 1,
        }
    }
    if barriers.is_empty() {
        // A resident child waits on no barrier for most of its life: it keeps no buffer.
        *barriers = Vec::new();
    }
}
