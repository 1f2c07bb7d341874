//! Provides [`SessionLog`]: one session's append-only event log, shared by the agent actor and
//! its running turn, serialized by a short lock that is never held across an `.await`.
//!
//! # Appends
//! [`SessionLog::append`] assigns `seq` (the log length) and `time`, checks the envelope and the
//! turn/step invariants of [`crate::session::invariants`], and commits. A refused event leaves
//! the log unchanged. Appends are synchronous and in memory.
//!
//! # Durability
//! Once the registry publishes the session, the log is *attached* to a store under the session's
//! lease (see [`crate::store::lease`]): a per-session writer task appends what the log committed
//! to the store, in order and in batches, naming the lease's fencing epoch (write-behind), and
//! renews the lease when the store asks for renewal. The writer reads straight from the log, so
//! the write-behind queue costs no memory beyond the log itself.
//!
//! - [`SessionLog::flush`] is the durability barrier: when it returns `Ok`, every event committed
//!   before the call is durable in the store.
//! - **A deferred creation writes nothing until it commits.** A delegated child's log may be
//!   attached before its session is stored: until its creation commits (with its first
//!   accepted message, or at its first entered step), nothing of it reaches the store, its
//!   barriers are met at once (there is nothing to make durable yet) and a close discards it.
//!   Once it commits, the writer's first write stores the header and every event so far at
//!   once, taking the session's lease.
//! - **The queue is bounded.** At most [`WRITE_BEHIND_LIMIT`] committed events may wait for the
//!   store. Appends themselves never block (they run on an actor's thread); the async producers —
//!   the turn driver before each step and each streamed chunk, and every send into the inbox —
//!   first wait for room, so a slow store slows its agents instead of growing their memory.
//! - **A failed write faults the log.** When an append, a flush or a lease renewal fails, the
//!   writer stops, the log is *faulted* and keeps that first error: every later flush or drain
//!   returns it, appends stay in memory only, and the fault hook tells the agent (which then
//!   ends its turn with an error and refuses new work). What the store holds is a prefix of the
//!   log that contains every event a successful flush covered.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::event::{EventKind, SessionEvent};
use crate::session::event_list::EventList;
use crate::session::header::{SessionHeader, SessionOrigin};
use crate::session::history::{History, Projection};
use crate::session::invariants::LogShape;
use crate::session::seed::{check_free_form_json, check_lossless, Seed};
pub(crate) use crate::session::write_behind::{Attachment, CreationCommit, WriterIdle};
use crate::session::write_behind::{
    Barrier, Creation, FaultHook, Resume, Signals, WriteBehind, Writer, WRITE_BEHIND_LIMIT,
};
use crate::store::{LeaseEpoch, SharedStore};

/// One session's log. Cloning gives another handle to the same log.
#[derive(Clone)]
pub struct SessionLog {
    pub(super) inner: Arc<LogInner>,
}

pub(super) struct LogInner {
    pub(super) state: Mutex<LogState>,
    /// Mirrors `state.fault.is_some()`, so the hot path checks it without the lock.
    pub(super) faulted: AtomicBool,
    /// Set when the agent that writes this log (one incarnation: each has its own log) stops
    /// running: every reference to it reads the agent as gone from then on, on any thread.
    pub(super) agent_stopped: AtomicBool,
}

pub(super) struct LogState {
    pub(super) header: SessionHeader,
    /// Shared with the write-behind batches and the store: an event is never deep-copied to
    /// be persisted.
    pub(super) events: EventList,
    pub(super) shape: LogShape,
    /// The model history, folded in as events are appended.
    pub(super) history: Projection,
    pub(super) write_behind: Option<WriteBehind>,
    /// The fencing epoch of the lease the session is written under, once it has one; kept
    /// after the close, so that a write beside the log (its projection checkpoint) is fenced
    /// by the same lease. (Granted epochs start at 1: the niche keeps the state within its
    /// allocation class.)
    pub(super) lease: Option<std::num::NonZeroU64>,
    /// The first failed durable write; set once, never cleared.
    /// Boxed: every live log carries the field, and almost none ever fault.
    pub(super) fault: Option<Box<SubagentError>>,
    /// A reader's memo that lives and dies with the live log (the projection registry's
    /// watermark cells), so it needs no registry of its own.
    /// Boxed twice: a thin pointer, where a trait object's is two words (the state of every
    /// live log sits within one allocation class, and most logs have no memo).
    pub(super) memo: Option<Box<Box<dyn LogMemo>>>,
}

/// A reader's memo kept with a live log ([`SessionLog::with_memo`]).
pub(crate) trait LogMemo: std::any::Any + Send {
    /// The seq below which the memo has read every event it needs: a log that pages out its
    /// events keeps those from here on.
    /// The memo's readers behind `first_resident` (the first event held) are left out: they
    /// catch up from the store.
    fn read_through(&self, first_resident: usize) -> usize;

    /// The memo as `Any`, to find its type (trait upcasting needs a newer Rust than the
    /// crate's minimum).
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// Whether the write-behind queue is full: as many events wait for the store as it may hold.
/// A session whose creation has not committed has no queue: nothing of it can be written yet.
fn backlog_full(state: &LogState) -> bool {
    state.write_behind.as_ref().is_some_and(|write_behind| {
        !write_behind.uncommitted()
            && len_of(&state.events).saturating_sub(write_behind.written) >= WRITE_BEHIND_LIMIT
    })
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("SessionLog")
            .field("id", &state.header.id)
            .field("len", &state.events.len())
            .finish()
    }
}

impl SessionLog {
    /// A new log for `header`, seeded with `seed`.
    ///
    /// The seed must pass [`crate::session::validate_seed`]. A non-empty seed gets a `session/end-seed` marker
    /// unless it already ends with one.
    ///
    /// # Errors
    /// `INVALID_HEADER` or `INVALID_SEED`.
    pub fn new(header: SessionHeader, seed: Vec<SessionEvent>) -> Result<Self> {
        Self::seeded(header, Seed::from(seed))
    }

    /// A new log for `header`, seeded with `seed`: as [`SessionLog::new`], except that a fork's
    /// seed is shared with its parent's log (not copied, not checked again) and recorded in the
    /// header as a [`crate::session::SeedReference`], so the store keeps only the child's own
    /// events. The header's `seedLength` must be the seed's length.
    ///
    /// # Errors
    /// `INVALID_HEADER` or `INVALID_SEED`.
    pub fn seeded(mut header: SessionHeader, seed: Seed) -> Result<Self> {
        let (events, reference, shape, history) = seed.into_parts()?;
        header.seed_reference = reference.map(Box::new);
        header.validate()?;
        let needs_marker = events
            .last()
            .is_some_and(|last| !matches!(last.kind, EventKind::EndSeed {}));
        let history = match history {
            Some(history) => Projection::starting_from(history),
            None => Projection::of_list(&events),
        };
        let log = Self::from_parts(header, events, shape, history);
        if needs_marker {
            log.append(EventKind::EndSeed {})?;
        }
        Ok(log)
    }

    /// A log rebuilt from a stored, already repaired event list; the seqs continue from it.
    pub(crate) fn from_stored(
        header: SessionHeader,
        events: Vec<Arc<SessionEvent>>,
    ) -> Result<Self> {
        let mut shape = LogShape::default();
        for event in &events {
            shape
                .admit(event)
                .map_err(|e| stored_invariant_broken(header.id, &e))?;
        }
        let history = Projection::of(&events);
        Ok(Self::from_parts(header, events.into(), shape, history))
    }

    fn from_parts(
        header: SessionHeader,
        events: EventList,
        shape: LogShape,
        history: Projection,
    ) -> Self {
        Self {
            inner: Arc::new(LogInner {
                state: Mutex::new(LogState {
                    header,
                    events,
                    shape,
                    history,
                    write_behind: None,
                    lease: None,
                    fault: None,
                    memo: None,
                }),
                faulted: AtomicBool::new(false),
                agent_stopped: AtomicBool::new(false),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        lock_state(&self.inner)
    }

    /// The seed length: the seqs below it are inherited (a fork's parent prefix).
    pub(crate) fn seed_len(&self) -> u64 {
        self.lock().header.seed_len()
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        self.lock().header.id
    }

    /// The header.
    pub fn header(&self) -> SessionHeader {
        self.lock().header.clone()
    }

    /// Where the session came from (the header's `origin`), without copying the header.
    pub(crate) fn origin(&self) -> Option<SessionOrigin> {
        self.lock().header.origin
    }

    /// The session's direct parent (the header's `parentSession`), without copying the header.
    pub(crate) fn parent_session(&self) -> Option<SessionId> {
        self.lock().header.parent_session
    }

    /// The number of events (the next seq).
    pub fn len(&self) -> u64 {
        len_of(&self.lock().events)
    }

    /// How many of the log's first events its store holds (written, whether flushed or not):
    /// 0 for a log no store backs, or one not stored yet. The store keeps them for as long as
    /// the session is stored, so a message handed to this session later lands at this seq or
    /// after it, whichever agent of the session takes it.
    pub(crate) fn stored_len(&self) -> u64 {
        self.lock()
            .write_behind
            .as_ref()
            .map_or(0, |write_behind| write_behind.written)
    }

    /// Whether the log has no events.
    pub fn is_empty(&self) -> bool {
        self.lock().events.is_empty()
    }

    /// The last turn number (0 before any turn).
    pub fn last_turn(&self) -> u64 {
        self.lock().shape.last_turn()
    }

    /// Whether no turn, step or tool call is open.
    pub fn is_balanced(&self) -> bool {
        self.lock().shape.is_balanced()
    }

    /// Whether a step is open (a fault may have left it so).
    pub fn has_open_step(&self) -> bool {
        self.lock().shape.open_step().is_some()
    }

    /// A copy of every event held in memory: all of them, unless the log pages out its settled
    /// events ([`crate::AgentOptions::resident_events`]), which the store then holds
    /// ([`crate::SessionPersistence::read_from`] after [`SessionLog::drain`]).
    pub fn events(&self) -> Vec<SessionEvent> {
        self.lock()
            .events
            .iter()
            .map(|event| (**event).clone())
            .collect()
    }

    /// A copy of the events from `seq` on held in memory (see [`SessionLog::events`]).
    pub fn events_from(&self, seq: u64) -> Vec<SessionEvent> {
        self.lock()
            .events
            .iter_from(usize::try_from(seq).unwrap_or(usize::MAX))
            .map(|event| (**event).clone())
            .collect()
    }

    /// The model history so far (its surface messages): an O(1) snapshot, kept up to date as
    /// events are appended (see [`crate::session::history`]).
    pub fn history(&self) -> History {
        self.lock().history.snapshot()
    }

    /// The seq of the first event held in memory: 0 unless the log pages out its settled
    /// events.
    pub fn first_resident(&self) -> u64 {
        u64::try_from(self.lock().events.first_resident()).unwrap_or(u64::MAX)
    }

    /// Where the events this log paged out (or inherited paged out) lie in the store.
    pub(crate) fn paged_prefix(&self) -> Option<crate::session::event_list::PagedPrefix> {
        self.lock().events.paged()
    }

    /// Runs `read` over the events held in memory (every event, unless the log pages out its
    /// settled events) without copying them. `read` must not touch this log.
    pub fn with_events<R>(&self, read: impl FnOnce(&EventList) -> R) -> R {
        read(&self.lock().events)
    }

    /// What storing the session now writes: the events of its own stored log (those after a
    /// seed stored by reference), with the next seq after them.
    pub(crate) fn stored_creation(&self) -> (u64, Vec<Arc<SessionEvent>>) {
        self.with_header_and_events(|header, events| {
            let own = usize::try_from(header.first_stored_seq()).unwrap_or(usize::MAX);
            (len_of(events), events.to_vec_range(own, events.len()))
        })
    }

    /// Waits until the events below `seq` are written to the store (not forced to disk): a
    /// seed's source log, before the child that references its prefix is stored, so a stored
    /// reference never names unwritten events (one store, so the child's flush covers them).
    ///
    /// # Errors
    /// This log's fault.
    pub(crate) async fn written_through(&self, seq: u64) -> Result<()> {
        self.barrier_at(seq, false).await
    }

    /// Waits until the events below `seq` are flushed: a seed's source log, before a child on
    /// another node (a reader of the shared store that this process does not order) inherits
    /// the prefix.
    ///
    /// # Errors
    /// This log's fault.
    pub(crate) async fn flushed_through(&self, seq: u64) -> Result<()> {
        self.barrier_at(seq, true).await
    }

    /// Runs `read` over the header and the events under one lock. `read` must not touch this
    /// log.
    pub(crate) fn with_header_and_events<R>(
        &self,
        read: impl FnOnce(&SessionHeader, &EventList) -> R,
    ) -> R {
        let state = self.lock();
        read(&state.header, &state.events)
    }

    /// Runs `read` over the header, the events and the model history as of the last `turn/end`
    /// (when the log still holds it), under one lock: what a fork child inherits. `read` must
    /// not touch this log.
    pub(crate) fn with_completed_turns<R>(
        &self,
        read: impl FnOnce(&SessionHeader, &EventList, Option<History>) -> R,
    ) -> R {
        let state = self.lock();
        read(
            &state.header,
            &state.events,
            state.history.through_last_turn(),
        )
    }

    /// Runs `read` over the log's own events: those after its seed (a fork child's inherited
    /// prefix).
    pub(crate) fn with_own_events<R>(
        &self,
        read: impl for<'e> FnOnce(&mut (dyn Iterator<Item = &'e Arc<SessionEvent>> + 'e)) -> R,
    ) -> R {
        let state = self.lock();
        let seed = usize::try_from(state.header.seed_len()).unwrap_or(usize::MAX);
        let mut own = state.events.iter_from(seed);
        read(&mut own)
    }

    /// What `pick` finds in the last of the log's own events (its seed left out) it finds
    /// anything in, searched from the end: a resume looks back this way once, however long
    /// the log has grown.
    pub(crate) fn last_of_own<R>(
        &self,
        pick: impl FnMut(&Arc<SessionEvent>) -> Option<R>,
    ) -> Option<R> {
        let state = self.lock();
        let seed = usize::try_from(state.header.seed_len()).unwrap_or(usize::MAX);
        state.events.iter_from(seed).rev().find_map(pick)
    }

    /// Runs `read` over the events and this log's memo of type `T` (created on first use, and
    /// replaced if another type was left there), under one lock: the memo always matches the
    /// events `read` sees. `read` must not touch this log.
    pub(crate) fn with_memo<T: LogMemo + Default, R>(
        &self,
        read: impl FnOnce(&mut T, &EventList) -> R,
    ) -> R {
        let mut state = self.lock();
        let LogState { events, memo, .. } = &mut *state;
        if !memo
            .as_deref_mut()
            .is_some_and(|memo| memo.as_any_mut().is::<T>())
        {
            *memo = Some(Box::new(Box::new(T::default())));
        }
        match memo
            .as_deref_mut()
            .and_then(|memo| memo.as_any_mut().downcast_mut::<T>())
        {
            Some(memo) => read(memo, events),
            // Unreachable: the slot was just set to a `T`.
            None => read(&mut T::default(), events),
        }
    }

    /// Appends one event and returns its seq.
    ///
    /// # Errors
    /// `INVALID_EVENT` when the event breaks an invariant or carries lossy JSON; the log is left
    /// unchanged.
    pub fn append(&self, kind: EventKind) -> Result<u64> {
        self.append_with_sources(kind, Vec::new())
    }

    /// Appends one event that derives from the earlier events `sources`.
    ///
    /// # Errors
    /// As [`SessionLog::append`].
    pub fn append_with_sources(&self, kind: EventKind, sources: Vec<u64>) -> Result<u64> {
        check_free_form_json(&kind, check_lossless)?;
        let mut state = self.lock();
        let seq = u64::try_from(state.events.len())
            .map_err(|_| SubagentError::bug("session log length exceeds u64"))?;
        let mut event = SessionEvent::new(seq, kind);
        event.source_event_seqs = sources.into_boxed_slice();
        state.shape.admit(&event)?;
        let event = Arc::new(event);
        state.history.push(&event);
        let resume = match state.write_behind.as_mut() {
            Some(write_behind) => {
                write_behind.appending(&event.kind);
                write_behind.wake()
            }
            None => Resume::default(),
        };
        state.events.push(event);
        drop(state);
        resume.run();
        Ok(seq)
    }

    /// The error that faulted the log, if a durable write failed.
    pub fn fault(&self) -> Option<SubagentError> {
        if !self.inner.faulted.load(Ordering::Acquire) {
            return None;
        }
        self.lock().fault.as_deref().cloned()
    }

    /// Whether a durable write of this log failed.
    pub fn is_faulted(&self) -> bool {
        self.inner.faulted.load(Ordering::Acquire)
    }

    /// Marks the agent writing this log as stopped; called by the agent itself, before it
    /// tells anyone it has stopped.
    pub(crate) fn mark_agent_stopped(&self) {
        self.inner.agent_stopped.store(true, Ordering::Release);
    }

    /// Whether the agent writing this log has stopped ([`SessionLog::mark_agent_stopped`]).
    pub(crate) fn agent_stopped(&self) -> bool {
        self.inner.agent_stopped.load(Ordering::Acquire)
    }

    /// Starts write-behind to `store`: for a stored session, events from `next_seq` on are
    /// appended under its lease; for a deferred creation, nothing is written until it commits,
    /// and then the whole session is stored at once. `on_fault` is told once if a durable write
    /// fails.
    ///
    /// Returns the writer task, for the caller to spawn. Dropped unfinished (or never spawned),
    /// it faults the log rather than leave a barrier waiting.
    #[must_use = "write-behind runs only once the returned task is spawned"]
    pub(crate) fn attach(
        &self,
        store: SharedStore,
        attachment: Attachment,
        on_fault: FaultHook,
        idle: WriterIdle,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (next_seq, lease, creation, holder, seed_source) = match attachment {
            Attachment::Stored { next_seq, lease } => {
                (next_seq, lease, Creation::Stored, None, None)
            }
            Attachment::Deferred {
                commit,
                holder,
                seed_source,
            } => (
                0,
                None,
                Creation::Waiting(commit),
                Some(holder),
                seed_source,
            ),
        };
        let signals = Arc::new(Signals::default());
        let id = {
            let mut state = self.lock();
            state.lease = lease.and_then(|lease| std::num::NonZeroU64::new(lease.epoch.0));
            state.write_behind = Some(WriteBehind {
                written: next_seq,
                durable: next_seq,
                barriers: Vec::new(),
                signals: Arc::clone(&signals),
                closing: None,
                closing_requested: false,
                on_fault: Some(on_fault),
                parked: None,
                creation,
            });
            state.header.id
        };
        signals.wake.notify_one();
        let writer = Writer {
            log: Arc::downgrade(&self.inner),
            store,
            id,
            lease,
            holder,
            seed_source,
            signals,
            finished: AtomicBool::new(false),
            idle,
        };
        writer.run()
    }

    /// Commits a deferred creation (see [`CreationCommit::Explicit`]): the writer stores the
    /// session with every event so far. A no-op for a stored session or a committed one.
    pub(crate) fn commit_creation(&self) {
        let resume = {
            let mut state = self.lock();
            match state.write_behind.as_mut() {
                Some(write_behind) if write_behind.uncommitted() => {
                    write_behind.creation = Creation::Committed;
                    write_behind.wake()
                }
                _ => Resume::default(),
            }
        };
        resume.run();
    }

    /// Whether the session's creation committed: false only while a deferred creation waits for
    /// its commit (it may be refused and rolled back; nothing of it is stored).
    pub(crate) fn is_committed(&self) -> bool {
        !self
            .lock()
            .write_behind
            .as_ref()
            .is_some_and(WriteBehind::uncommitted)
    }

    /// Waits until a deferred creation is in the store (written, not forced to disk): at once
    /// for a session stored from the start. A creation that reached the store stays stored: a
    /// later write's failure faults the session, not its creation.
    ///
    /// # Errors
    /// The fault, when the creation's write failed.
    ///
    /// # Cancel safety
    /// As [`SessionLog::drain`].
    pub(crate) async fn stored(&self) -> Result<()> {
        let (deferred, leased) = {
            let state = self.lock();
            let deferred = state
                .write_behind
                .as_ref()
                .is_some_and(|write_behind| write_behind.creation != Creation::Stored);
            (deferred, state.lease.is_some())
        };
        if deferred {
            // The creation stores every event so far at once: its first event being written
            // is the creation being written, whatever fails after it.
            self.barrier_at(1, false).await
        } else if leased {
            // A lease is taken with the creation's write (or held from the start): the session
            // is in the store, whatever failed since. (On two threads a child's first turn may
            // fault its log before its start asks.)
            Ok(())
        } else {
            self.fault().map_or(Ok(()), Err)
        }
    }

    /// The fencing epoch of the lease the session was last written under, if any.
    pub(crate) fn lease_epoch(&self) -> Option<LeaseEpoch> {
        self.lock().lease.map(|epoch| LeaseEpoch(epoch.get()))
    }

    /// Writes what is left, releases the lease and stops write-behind; appends after it stay in
    /// memory. A log that was never attached closes trivially.
    ///
    /// # Errors
    /// The fault, when a durable write failed (before or during the close).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; the writer still finishes and stops.
    pub(crate) async fn close(&self) -> Result<()> {
        let (reply, closed) = oneshot::channel();
        let (first_close, resume) = {
            let mut state = self.lock();
            if let Some(fault) = &state.fault {
                return Err(SubagentError::clone(fault));
            }
            let Some(write_behind) = state.write_behind.as_mut() else {
                return Ok(());
            };
            let first = !write_behind.closing_requested;
            let mut resume = Resume::default();
            if first {
                write_behind.closing_requested = true;
                write_behind.closing = Some(reply);
                resume = write_behind.wake();
            }
            (first, resume)
        };
        resume.run();
        if !first_close {
            // A second close waits like a drain of the same writer.
            return self.barrier(false).await;
        }
        closed
            .await
            .unwrap_or_else(|_| self.fault().map_or(Ok(()), Err))
    }

    /// Releases what only a live agent needs (the model-history projection); the events stay
    /// readable. Called once the agent is disposed.
    pub(crate) fn retire(&self) {
        // The projection memo stays: it is small, and it orders late checkpoint writes.
        self.lock().history = Projection::default();
    }

    /// Waits until the write-behind queue has room (see the module docs).
    ///
    /// # Errors
    /// The fault, when the log faulted.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn reserve(&self) -> Result<()> {
        loop {
            let room = {
                let state = self.lock();
                if let Some(fault) = &state.fault {
                    return Err(SubagentError::clone(fault));
                }
                match state.write_behind.as_ref() {
                    Some(write_behind) if backlog_full(&state) => Arc::clone(&write_behind.signals),
                    _ => return Ok(()),
                }
            };
            let notified = room.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Re-check after enabling: the writer may have made room in between.
            let backlog_left = {
                let state = self.lock();
                state.fault.is_none() && backlog_full(&state)
            };
            if backlog_left {
                notified.await;
            }
        }
    }

    /// Whether [`SessionLog::reserve`] would return at once without an error: no fault, and
    /// room in the write-behind queue. Lets a caller skip the wait's state in the common case.
    pub(crate) fn has_room(&self) -> bool {
        let state = self.lock();
        state.fault.is_none() && !backlog_full(&state)
    }

    /// Waits until every event committed before this call is durable in the store.
    ///
    /// A log that was never attached (a staging log, or a runtime without persistence) flushes
    /// trivially.
    ///
    /// # Errors
    /// The fault (`STORE_IO`, `STORE_CONFLICT`, `LEASE_LOST`, ...) when a durable write of this
    /// log failed, now or earlier.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; the writes still complete.
    pub async fn flush(&self) -> Result<()> {
        self.barrier(true).await
    }

    /// Waits until every event committed before this call has been handed to the store, without
    /// forcing it to disk. After it, a reader of the store in this process sees the whole log;
    /// only [`SessionLog::flush`] makes it survive a crash.
    ///
    /// # Errors
    /// As [`SessionLog::flush`].
    ///
    /// # Cancel safety
    /// As [`SessionLog::flush`].
    pub async fn drain(&self) -> Result<()> {
        self.barrier(false).await
    }

    async fn barrier(&self, durable: bool) -> Result<()> {
        self.barrier_at(u64::MAX, durable).await
    }

    /// Waits until the events below `target` (at most every event committed before this call)
    /// are written (or, `durable`, flushed).
    async fn barrier_at(&self, target: u64, durable: bool) -> Result<()> {
        let (reply, done) = oneshot::channel();
        let resume = {
            let mut state = self.lock();
            if let Some(fault) = &state.fault {
                return Err(SubagentError::clone(fault));
            }
            let target = len_of(&state.events).min(target);
            let Some(write_behind) = state.write_behind.as_mut() else {
                return Ok(());
            };
            let reached = if durable {
                write_behind.durable
            } else {
                write_behind.written
            };
            if target <= reached {
                return Ok(());
            }
            write_behind.barriers.push(Barrier {
                target,
                durable,
                reply,
            });
            write_behind.wake()
        };
        resume.run();
        done.await.unwrap_or_else(|_| {
            // The writer stopped without answering: only a fault or a dropped log does that.
            Err(self.fault().unwrap_or_else(|| {
                SubagentError::new(
                    ErrorCode::StoreIo,
                    "session writer stopped before the flush",
                )
            }))
        })
    }
}

/// A stored event that breaks a log invariant (`STORE_CORRUPT`).
pub(super) fn stored_invariant_broken(id: SessionId, broken: &SubagentError) -> SubagentError {
    SubagentError::new(
        ErrorCode::StoreCorrupt,
        format!(
            "session {id}: stored log breaks an invariant: {}",
            broken.message()
        ),
    )
}

pub(super) fn lock_state(inner: &LogInner) -> MutexGuard<'_, LogState> {
    // A panic while the lock was held cannot leave the state half-written: every mutation is
    // checked first and committed with one push or one assignment.
    inner.state.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn len_of(events: &EventList) -> u64 {
    u64::try_from(events.len()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::FutureExt;

    use super::*;
    use crate::store::{LeaseHolder, MemoryStore, SessionPersistence};
    use crate::testing::{FaultInjectingStore, StoreOperation};

    fn note(log: &SessionLog) {
        log.append(EventKind::Extension {
            event_type: "test/note".into(),
            data: serde_json::json!({}),
        })
        .expect("a note appends");
    }

    async fn attached(store: &Arc<FaultInjectingStore>) -> (SessionLog, Arc<AtomicUsize>) {
        attached_idling(store, WriterIdle::Park).await
    }

    async fn attached_idling(
        store: &Arc<FaultInjectingStore>,
        idle: WriterIdle,
    ) -> (SessionLog, Arc<AtomicUsize>) {
        let log = SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap();
        store.create(log.header(), Vec::new()).await.unwrap();
        let lease = store
            .acquire_lease(log.id(), LeaseHolder::new())
            .await
            .unwrap();
        let faults = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&faults);
        tokio::spawn(log.attach(
            Arc::clone(store) as SharedStore,
            Attachment::Stored {
                next_seq: 0,
                lease: Some(lease),
            },
            Box::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
            idle,
        ));
        (log, faults)
    }

    fn faulting_store() -> Arc<FaultInjectingStore> {
        Arc::new(FaultInjectingStore::new(Arc::new(MemoryStore::new())))
    }

    /// A fresh session attached to `store` with its creation deferred until it is committed.
    fn attached_deferred(store: &Arc<FaultInjectingStore>) -> SessionLog {
        let log = SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap();
        tokio::spawn(log.attach(
            Arc::clone(store) as SharedStore,
            Attachment::Deferred {
                commit: CreationCommit::Explicit,
                holder: LeaseHolder::new(),
                seed_source: None,
            },
            Box::new(|_| {}),
            WriterIdle::Park,
        ));
        log
    }

    /// A deferred creation that reached the store is stored, even once a later write of the
    /// session failed: a continuable start whose child's first turn faulted the log on another
    /// thread before the start asked is answered, since the child exists, and is not refused,
    /// which left the child stored under a refused start (a ghost: the history checker found it
    /// with the runtime on two workers).
    #[tokio::test]
    async fn a_stored_creation_stays_stored_after_a_later_write_fails() {
        let store = faulting_store();
        let log = attached_deferred(&store);
        note(&log);
        log.commit_creation();
        log.drain().await.expect("the creation is written");
        store.arm(StoreOperation::Append);
        note(&log);
        assert!(log.drain().await.is_err(), "the append fails");
        assert!(log.is_faulted());
        log.stored()
            .await
            .expect("the creation was stored before the append failed");
        // A creation that never reached the store is not.
        store.arm(StoreOperation::Create);
        let refused = attached_deferred(&store);
        note(&refused);
        refused.commit_creation();
        assert!(refused.stored().await.is_err(), "its creation failed");
        assert!(
            refused.stored().await.is_err(),
            "and still did, asked again"
        );
    }

    #[tokio::test]
    async fn a_full_queue_makes_producers_wait_until_the_store_catches_up() {
        let store = faulting_store();
        store.hold(StoreOperation::Append);
        let (log, _) = attached(&store).await;
        for _ in 0..WRITE_BEHIND_LIMIT {
            note(&log);
        }
        assert!(
            log.reserve().now_or_never().is_none(),
            "a producer waits while {WRITE_BEHIND_LIMIT} events wait for the store"
        );
        store.release(StoreOperation::Append);
        log.reserve().await.expect("room once the store caught up");
        log.flush().await.unwrap();
        assert_eq!(
            store.read_from(log.id(), 0).await.unwrap().len(),
            usize::try_from(WRITE_BEHIND_LIMIT).unwrap()
        );
    }

    #[tokio::test]
    async fn a_failed_append_faults_the_log_once_and_every_barrier_reports_it() {
        let store = faulting_store();
        let (log, faults) = attached(&store).await;
        note(&log);
        log.flush().await.expect("the first event is durable");
        store.arm(StoreOperation::Append);
        note(&log);
        let error = log.flush().await.unwrap_err();
        assert_eq!(error.code(), ErrorCode::StoreIo);
        assert!(log.is_faulted());
        assert_eq!(log.fault(), Some(error.clone()));
        assert_eq!(faults.load(Ordering::SeqCst), 1, "the hook is told once");
        store.disarm(StoreOperation::Append);
        note(&log);
        assert_eq!(log.drain().await.unwrap_err(), error, "the fault sticks");
        assert_eq!(log.close().await.unwrap_err(), error);
        assert_eq!(log.reserve().await.unwrap_err(), error);
        assert_eq!(
            store.read_from(log.id(), 0).await.unwrap().len(),
            1,
            "the store holds the flushed prefix and nothing after the fault"
        );
    }

    #[tokio::test]
    async fn a_failed_flush_faults_the_log() {
        let store = faulting_store();
        let (log, faults) = attached(&store).await;
        note(&log);
        store.arm(StoreOperation::Flush);
        assert_eq!(log.flush().await.unwrap_err().code(), ErrorCode::StoreIo);
        assert_eq!(faults.load(Ordering::SeqCst), 1);
        assert!(log.is_faulted());
    }

    // A writer task dropped before it ran (its worker stopped, or the runtime shut down) must
    // not leave a barrier or a closer waiting forever: the log faults instead.
    #[tokio::test]
    async fn a_dropped_writer_faults_the_log_instead_of_leaving_waiters() {
        let store = faulting_store();
        let log = SessionLog::new(SessionHeader::new(SessionId::new()), Vec::new()).unwrap();
        store.create(log.header(), Vec::new()).await.unwrap();
        let faults = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&faults);
        let writing = log.attach(
            Arc::clone(&store) as SharedStore,
            Attachment::Stored {
                next_seq: 0,
                lease: None,
            },
            Box::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
            WriterIdle::Park,
        );
        note(&log);
        drop(writing);
        let flushed = log
            .flush()
            .now_or_never()
            .expect("the flush is answered at once");
        assert_eq!(
            flushed.unwrap_err().code(),
            ErrorCode::PersistenceUnavailable
        );
        assert!(log.is_faulted());
        assert_eq!(faults.load(Ordering::SeqCst), 1);
        assert_eq!(
            log.close()
                .now_or_never()
                .expect("the close is answered at once")
                .unwrap_err()
                .code(),
            ErrorCode::PersistenceUnavailable
        );
    }

    #[tokio::test]
    async fn a_flush_already_covered_needs_no_store_round_trip() {
        let store = faulting_store();
        let (log, _) = attached(&store).await;
        note(&log);
        log.flush().await.unwrap();
        let flushes = store.flush_count();
        log.flush().await.unwrap();
        assert_eq!(store.flush_count(), flushes, "nothing new to make durable");
    }

    #[tokio::test]
    async fn an_answered_barrier_leaves_no_buffer_behind() {
        let store = faulting_store();
        let (log, _) = attached(&store).await;
        note(&log);
        log.flush().await.unwrap();
        let barriers = log
            .lock()
            .write_behind
            .as_ref()
            .map(|write_behind| write_behind.barriers.capacity());
        assert_eq!(
            barriers,
            Some(0),
            "a resident log keeps no room for barriers it no longer has"
        );
    }

    #[tokio::test]
    async fn close_writes_the_tail_and_releases_the_lease() {
        let store = faulting_store();
        let (log, _) = attached(&store).await;
        note(&log);
        note(&log);
        log.close().await.unwrap();
        assert_eq!(store.read_from(log.id(), 0).await.unwrap().len(), 2);
        store
            .acquire_lease(log.id(), LeaseHolder::new())
            .await
            .expect("the lease was released");
        log.close().await.expect("a second close is a no-op");
    }

    // What every live log costs: its shared state sits in an `Arc` (16 bytes of counts) within
    // mimalloc's 384-byte class; one byte more moves every log into the next class.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_live_log_stays_within_its_allocation_class() {
        assert!(
            std::mem::size_of::<LogInner>() <= 368,
            "{}",
            std::mem::size_of::<LogInner>()
        );
    }

    /// Yields until the log's writer has parked (it parks as soon as it is idle).
    async fn until_parked(log: &SessionLog) {
        for _ in 0..10_000 {
            let parked = log
                .lock()
                .write_behind
                .as_ref()
                .is_some_and(|write_behind| write_behind.parked.is_some());
            if parked {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the idle writer never parked");
    }

    /// A log attached to `store`, one note written, its writer parked.
    async fn parked_after_a_note(store: &Arc<FaultInjectingStore>) -> SessionLog {
        let (log, _) = attached(store).await;
        note(&log);
        log.drain().await.unwrap();
        until_parked(&log).await;
        log
    }

    #[tokio::test]
    async fn an_idle_writer_parks_and_the_next_append_starts_it_again() {
        let store = faulting_store();
        let log = parked_after_a_note(&store).await;
        note(&log);
        log.flush().await.expect("the parked writer ran again");
        assert_eq!(store.read_from(log.id(), 0).await.unwrap().len(), 2);
        until_parked(&log).await;
        log.close().await.expect("a close starts a parked writer");
        store
            .acquire_lease(log.id(), LeaseHolder::new())
            .await
            .expect("the close released the lease");
    }

    #[tokio::test]
    async fn a_log_dropped_while_its_writer_is_parked_still_releases_the_lease() {
        let store = faulting_store();
        let log = parked_after_a_note(&store).await;
        let id = log.id();
        drop(log);
        for _ in 0..10_000 {
            if store.acquire_lease(id, LeaseHolder::new()).await.is_ok() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the dropped log's lease was never released");
    }

    #[tokio::test]
    async fn a_writer_renewing_a_lease_with_a_time_to_live_never_parks() {
        let store = Arc::new(FaultInjectingStore::new(Arc::new(
            MemoryStore::with_lease_ttl(std::time::Duration::from_secs(60)),
        )));
        let (log, _) = attached(&store).await;
        assert!(
            stays_unparked_after_a_note(&log).await,
            "a writer that must renew its lease keeps its task and its timer"
        );
    }

    /// Writes a note, drains it and lets the writer run a while: whether it is still not
    /// parked then.
    async fn stays_unparked_after_a_note(log: &SessionLog) -> bool {
        note(log);
        log.drain().await.unwrap();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        log.lock()
            .write_behind
            .as_ref()
            .is_some_and(|write_behind| write_behind.parked.is_none())
    }

    #[tokio::test]
    async fn a_short_lived_sessions_writer_waits_as_a_task_instead_of_parking() {
        let store = faulting_store();
        let (log, _) = attached_idling(&store, WriterIdle::Wait).await;
        assert!(
            stays_unparked_after_a_note(&log).await,
            "an idle writer of a short-lived session keeps its task"
        );
        note(&log);
        log.flush()
            .await
            .expect("the waiting writer wrote the next note");
        assert_eq!(store.read_from(log.id(), 0).await.unwrap().len(), 2);
        log.close().await.expect("the waiting writer closes");
        store
            .acquire_lease(log.id(), LeaseHolder::new())
            .await
            .expect("the close released the lease");
    }

    #[tokio::test]
    async fn a_fenced_writer_faults_with_lease_lost() {
        let store = faulting_store();
        let (log, faults) = attached(&store).await;
        note(&log);
        log.flush().await.unwrap();
        // Another runtime took over (the lease was released behind this writer's back).
        let holder = LeaseHolder::new();
        store
            .release_lease(log.id(), crate::store::LeaseEpoch(1))
            .await
            .unwrap();
        store.acquire_lease(log.id(), holder.clone()).await.unwrap();
        note(&log);
        assert_eq!(log.flush().await.unwrap_err().code(), ErrorCode::LeaseLost);
        assert_eq!(faults.load(Ordering::SeqCst), 1);
    }
}
