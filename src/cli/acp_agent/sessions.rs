//! The ACP sessions one `subagents acp-agent` process serves, kept bounded: `session/close`
//! frees one, a `session/new` under an id already in use replaces (and disposes) the old one,
//! and past a bound ([`MAX_SESSIONS`] unless `--max-sessions` says otherwise) the least
//! recently used idle session is closed to make room.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use subagents::AgentHandle;

/// How many sessions one process keeps open at most, by default.
pub(crate) const MAX_SESSIONS: u32 = 256;

/// One ACP session: its root agent and the prompt running in it.
pub(crate) struct Session {
    pub(crate) handle: AgentHandle,
    pub(crate) cwd: PathBuf,
    /// The model name its agent calls with a scripted model: the script of its own that its
    /// prompts' steps go to, so sessions prompted at once never answer each other's prompts.
    pub(crate) script: Option<String>,
    pub(crate) running: Mutex<Option<CancellationToken>>,
    /// When it was last opened or prompted, in the table's own count.
    used: AtomicU64,
}

impl Session {
    pub(crate) fn new(handle: AgentHandle, cwd: PathBuf, script: Option<String>) -> Self {
        Self {
            handle,
            cwd,
            script,
            running: Mutex::default(),
            used: AtomicU64::new(0),
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn release_prompt(&self) {
        *self.running() = None;
    }

    /// Cancels the prompt running in it, if any.
    pub(crate) fn cancel_prompt(&self) {
        if let Some(running) = self.running().clone() {
            running.cancel();
        }
    }

    /// Closes it: cancels its prompt and disposes its agent.
    pub(crate) async fn close(&self) {
        self.cancel_prompt();
        if let Err(error) = self.handle.dispose().await {
            tracing::warn!(%error, "a closed ACP session's agent did not dispose cleanly");
        }
    }
}

/// The open sessions by protocol id.
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Arc<Session>>>,
    clock: AtomicU64,
    max: usize,
}

impl Sessions {
    /// An empty table that keeps at most `max` sessions open (at least one).
    pub(crate) fn new(max: usize) -> Self {
        Self {
            open: Mutex::default(),
            clock: AtomicU64::new(0),
            max: max.max(1),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn touch(&self, session: &Session) {
        session.used.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }

    /// The session `id`, marked used.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.open().get(id).cloned()?;
        self.touch(&session);
        Some(session)
    }

    /// Opens `session` as `id`; answers the sessions it displaced, for the caller to close
    /// outside the lock: the one it replaced under the same id, and the least recently used
    /// idle ones beyond the bound.
    pub(crate) fn insert(&self, id: String, session: Arc<Session>) -> Vec<Arc<Session>> {
        self.touch(&session);
        let mut open = self.open();
        let mut displaced: Vec<Arc<Session>> = open.insert(id, session).into_iter().collect();
        while open.len() > self.max {
            let oldest_idle = open
                .iter()
                .filter(|(_, session)| session.running().is_none())
                .min_by_key(|(_, session)| session.used.load(Ordering::Relaxed))
                .map(|(id, _)| id.clone());
            // Every session is running a prompt: none is closed under it.
            let Some(oldest) = oldest_idle else { break };
            displaced.extend(open.remove(&oldest));
        }
        displaced
    }

    /// Takes session `id` out, if open.
    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.open().remove(id)
    }
}
