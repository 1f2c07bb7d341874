//! Provides [`SessionLogView`]: a live agent's session log as everyone but its actor sees it —
//! readable and flushable, never writable, so no holder of an agent reference can open a turn or
//! journal a message behind the actor's back.

use crate::error::{Result, SubagentError};
use crate::ids::SessionId;
use crate::session::{History, SessionEvent, SessionHeader, SessionLog};

/// A read-only view of a live agent's [`SessionLog`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SessionLogView(SessionLog);

impl SessionLogView {
    pub(crate) fn new(log: SessionLog) -> Self {
        Self(log)
    }

    /// The log itself, for the crate's own writers (the actor, disposal).
    pub(crate) fn inner(&self) -> &SessionLog {
        &self.0
    }

    /// The session id.
    pub fn id(&self) -> SessionId {
        self.0.id()
    }

    /// The header.
    pub fn header(&self) -> SessionHeader {
        self.0.header()
    }

    /// The number of events (the next seq).
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether the log has no events.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The last turn number (0 before any turn).
    pub fn last_turn(&self) -> u64 {
        self.0.last_turn()
    }

    /// Whether no turn, step or tool call is open.
    pub fn is_balanced(&self) -> bool {
        self.0.is_balanced()
    }

    /// A copy of every event held in memory: all of them, unless the agent pages out its
    /// settled events ([`crate::AgentOptions::resident_events`]), which the store then holds
    /// ([`crate::SessionPersistence::read_from`] after [`SessionLogView::drain`]).
    pub fn events(&self) -> Vec<SessionEvent> {
        self.0.events()
    }

    /// The seq of the first event held in memory: 0 unless the agent pages out its settled
    /// events.
    pub fn first_resident(&self) -> u64 {
        self.0.first_resident()
    }

    /// A copy of the events from `seq` on held in memory (see [`SessionLogView::events`]).
    pub fn events_from(&self, seq: u64) -> Vec<SessionEvent> {
        self.0.events_from(seq)
    }

    /// The model history so far: an O(1) snapshot (empty once the agent is disposed).
    pub fn history(&self) -> History {
        self.0.history()
    }

    /// Runs `read` over the events held in memory (see [`SessionLogView::events`]) without
    /// copying them. `read` must not touch this log.
    pub fn with_events<R>(&self, read: impl FnOnce(&crate::session::EventList) -> R) -> R {
        self.0.with_events(read)
    }

    /// The error that faulted the log, if a durable write failed.
    pub fn fault(&self) -> Option<SubagentError> {
        self.0.fault()
    }

    /// Whether a durable write of this log failed.
    pub fn is_faulted(&self) -> bool {
        self.0.is_faulted()
    }

    /// As [`SessionLog::flush`].
    ///
    /// # Errors
    /// The fault, when a durable write of this log failed.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the wait; the writes still complete.
    pub async fn flush(&self) -> Result<()> {
        self.0.flush().await
    }

    /// As [`SessionLog::drain`].
    ///
    /// # Errors
    /// As [`SessionLogView::flush`].
    ///
    /// # Cancel safety
    /// As [`SessionLogView::flush`].
    pub async fn drain(&self) -> Result<()> {
        self.0.drain().await
    }
}
