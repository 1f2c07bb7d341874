//! Provides [`SessionLog`]: one session's append-only event log, shared by the agent actor and
//! its running turn, serialized by a short lock that is never held across an `.await`.
//!
//! # Appends
//! [`SessionLog::append`] assigns `seq` (the log length) and `time`, checks the envelope and the
//! turn/step invariants of [`crate::session::invariants`], and commits. A refused event leaves
//! the log unchanged. Appends are synchronous and in memory.
//!
//! # Durability
//! Once the registry publishes the session, the log is *attached* to a store: every committed
//! event is handed, in order, to a per-session writer task that appends batches to the store
//! (write-behind). [`SessionLog::flush`] is the durability barrier: when it returns `Ok`, every
//! event committed before the call is durable in the store.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, oneshot};

use crate::error::{ErrorCode, Result, SubagentError};
use crate::ids::SessionId;
use crate::session::event::{EventKind, SessionEvent};
use crate::session::header::SessionHeader;
use crate::session::invariants::LogShape;
use crate::session::seed::{check_lossless, free_form_json, validate_seed};
use crate::store::SharedStore;

/// One session's log. Cloning gives another handle to the same log.
#[derive(Clone)]
pub struct SessionLog {
    inner: Arc<Mutex<LogState>>,
}

struct LogState {
    header: SessionHeader,
    events: Vec<SessionEvent>,
    shape: LogShape,
    writer: Option<mpsc::UnboundedSender<WriterCommand>>,
}

enum WriterCommand {
    Append(Box<SessionEvent>),
    /// Reply once everything before is appended; fsync too when `durable`.
    Barrier {
        reply: oneshot::Sender<Result<()>>,
        durable: bool,
    },
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
    /// The seed must pass [`validate_seed`]. A non-empty seed gets a `session/end-seed` marker
    /// unless it already ends with one.
    ///
    /// # Errors
    /// `INVALID_HEADER` or `INVALID_SEED`.
    pub fn new(header: SessionHeader, seed: Vec<SessionEvent>) -> Result<Self> {
        header.validate()?;
        let shape = validate_seed(&seed)?;
        let needs_marker = seed
            .last()
            .is_some_and(|last| !matches!(last.kind, EventKind::EndSeed {}));
        let log = Self::from_parts(header, seed, shape);
        if needs_marker {
            log.append(EventKind::EndSeed {})?;
        }
        Ok(log)
    }

    /// A log rebuilt from a stored, already repaired event list; the seqs continue from it.
    pub(crate) fn from_stored(header: SessionHeader, events: Vec<SessionEvent>) -> Result<Self> {
        let mut shape = LogShape::default();
        for event in &events {
            shape.admit(event).map_err(|e| {
                SubagentError::new(
                    ErrorCode::StoreCorrupt,
                    format!(
                        "session {}: stored log breaks an invariant: {}",
                        header.id,
                        e.message()
                    ),
                )
            })?;
        }
        Ok(Self::from_parts(header, events, shape))
    }

    fn from_parts(header: SessionHeader, events: Vec<SessionEvent>, shape: LogShape) -> Self {
        Self {
            inner: Arc::new(Mutex::new(LogState {
                header,
                events,
                shape,
                writer: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A panic while the lock was held cannot leave the state half-written: every mutation
        // is checked first and committed with one push.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        self.lock().header.id
    }

    /// The header.
    pub fn header(&self) -> SessionHeader {
        self.lock().header.clone()
    }

    /// The number of events (the next seq).
    pub fn len(&self) -> u64 {
        u64::try_from(self.lock().events.len()).unwrap_or(u64::MAX)
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

    /// A copy of every event.
    pub fn events(&self) -> Vec<SessionEvent> {
        self.lock().events.clone()
    }

    /// A copy of the events from `seq` on.
    pub fn events_from(&self, seq: u64) -> Vec<SessionEvent> {
        let state = self.lock();
        let start = usize::try_from(seq)
            .unwrap_or(usize::MAX)
            .min(state.events.len());
        state.events[start..].to_vec()
    }

    /// Runs `read` over the events without copying them. `read` must not touch this log.
    pub fn with_events<R>(&self, read: impl FnOnce(&[SessionEvent]) -> R) -> R {
        read(&self.lock().events)
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
        for value in free_form_json(&kind) {
            check_lossless(value)?;
        }
        let mut state = self.lock();
        let seq = u64::try_from(state.events.len())
            .map_err(|_| SubagentError::bug("session log length exceeds u64"))?;
        let mut event = SessionEvent::new(seq, kind);
        event.source_event_seqs = sources;
        state.shape.admit(&event)?;
        if let Some(writer) = &state.writer {
            if writer
                .send(WriterCommand::Append(Box::new(event.clone())))
                .is_err()
            {
                tracing::warn!(session_id = %state.header.id, seq, "session writer stopped; event kept in memory only");
            }
        }
        state.events.push(event);
        Ok(seq)
    }

    /// Starts write-behind to `store`: events from `next_seq` on are appended to the store.
    pub(crate) fn attach(&self, store: SharedStore, next_seq: u64) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let id = {
            let mut state = self.lock();
            for event in state
                .events
                .iter()
                .skip(usize::try_from(next_seq).unwrap_or(usize::MAX))
            {
                // The receiver is alive: it is only moved into the task below.
                let _ = sender.send(WriterCommand::Append(Box::new(event.clone())));
            }
            state.writer = Some(sender);
            state.header.id
        };
        tokio::spawn(run_writer(store, id, next_seq, receiver));
    }

    /// Stops write-behind after the events already committed are written.
    pub(crate) fn detach(&self) {
        self.lock().writer = None;
    }

    /// Waits until every event committed before this call is durable in the store.
    ///
    /// A log that was never attached (a staging log, or a runtime without persistence) flushes
    /// trivially.
    ///
    /// # Errors
    /// `STORE_IO` or `STORE_CONFLICT` when a write-behind batch or the flush failed.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; the writes still complete.
    pub async fn flush(&self) -> Result<()> {
        self.barrier(true).await
    }

    /// Waits until every event committed before this call has been handed to the store, without
    /// forcing it to disk: the final drain of a disposed session. After it, a reader of the
    /// store in this process sees the whole log; only [`SessionLog::flush`] makes it survive a
    /// crash.
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
        let (reply, done) = oneshot::channel();
        let sent = {
            let state = self.lock();
            match &state.writer {
                Some(writer) => writer
                    .send(WriterCommand::Barrier { reply, durable })
                    .is_ok(),
                None => return Ok(()),
            }
        };
        if !sent {
            return Err(SubagentError::new(
                ErrorCode::StoreIo,
                "session writer stopped before the flush",
            ));
        }
        done.await.map_err(|_| {
            SubagentError::new(
                ErrorCode::StoreIo,
                "session writer stopped during the flush",
            )
        })?
    }
}

/// The write-behind task of one session: drains the queue in batches, in order.
async fn run_writer(
    store: SharedStore,
    id: SessionId,
    mut next_seq: u64,
    mut commands: mpsc::UnboundedReceiver<WriterCommand>,
) {
    let mut failure: Option<SubagentError> = None;
    while let Some(first) = commands.recv().await {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut command = Some(first);
        while let Some(current) = command.take() {
            match current {
                WriterCommand::Append(event) => batch.push(*event),
                WriterCommand::Barrier { reply, durable } => flushes.push((reply, durable)),
            }
            command = commands.try_recv().ok();
        }
        if !batch.is_empty() && failure.is_none() {
            let count = u64::try_from(batch.len()).unwrap_or(u64::MAX);
            match store.append(id, next_seq, batch, None).await {
                Ok(()) => next_seq += count,
                Err(error) => {
                    tracing::error!(session_id = %id, %error, "write-behind append failed");
                    failure = Some(error);
                }
            }
        }
        let durable = flushes.iter().any(|(_, durable)| *durable);
        let flushed = match &failure {
            Some(error) => Err(error.clone()),
            None if durable => store.flush(id).await,
            None => Ok(()),
        };
        for (reply, _) in flushes {
            let outcome = flushed.clone();
            // The flusher may have stopped waiting; the flush still happened.
            let _ = reply.send(outcome);
        }
    }
}
