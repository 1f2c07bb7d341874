//! Provides [`Settlements`]: how a host waits for its continuable children to settle, without
//! matching lifecycle events itself.
//!
//! A host opens one for a parent *before* it starts or follows up a child, so no settlement can
//! slip past it, then awaits each child's next settlement:
//!
//! ```text
//! let mut settled = rt.subagents().settlements(parent.agent());
//! let started = rt.subagents().start_continuable(spec).await?;
//! let epoch = settled.next_of(started.child_id).await?;   // stop reason and final output
//! ```

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::error::{ErrorCode, Result, SubagentError};
use crate::events::{EventBus, EventScope, Subscription};
use crate::ids::SessionId;
use crate::seam::{SubagentEvent, SubagentRunEndInfo};

/// The settlements (`subagent/end`) of one parent's children, in the order they happened, from
/// the moment it was opened for as long as it lives.
///
/// Each epoch of a continuable child settles once, so [`Settlements::next_of`] answers once
/// per epoch: the first call after a start answers the start's epoch, the next one the epoch a
/// follow-up ran in. A settlement nobody has asked for yet is kept until it is asked for (or
/// this is dropped): open one per wait, or drop it when done, if the parent has many children
/// the host does not wait for. One-shot children of the parent settle here too.
pub struct Settlements {
    ended: mpsc::UnboundedReceiver<SubagentRunEndInfo>,
    /// Received, not yet asked for, in order.
    kept: VecDeque<SubagentRunEndInfo>,
    _subscription: Subscription,
}

impl std::fmt::Debug for Settlements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settlements")
            .field("kept", &self.kept.len())
            .finish_non_exhaustive()
    }
}

impl Settlements {
    /// Settlements of the children of `parent` (a session id), heard on `events`.
    pub(crate) fn open(events: &Arc<EventBus<SubagentEvent>>, parent: SessionId) -> Self {
        let (sender, ended) = mpsc::unbounded_channel();
        let subscription =
            events.subscribe(EventScope::Key(parent), move |event: &SubagentEvent| {
                if let SubagentEvent::End(end) = event {
                    // A closed receiver means nobody waits any more.
                    let _ = sender.send(end.clone());
                }
            });
        Self {
            ended,
            kept: VecDeque::new(),
            _subscription: subscription,
        }
    }

    /// The next settlement of any child, in the order they settled.
    ///
    /// # Errors
    /// `CANCELLED` when the runtime's event bus is gone (the runtime was dropped).
    pub async fn next(&mut self) -> Result<SubagentRunEndInfo> {
        match self.kept.pop_front() {
            Some(end) => Ok(end),
            None => self.receive().await,
        }
    }

    /// The next settlement of `child`: its epoch's stop reason and final output. Settlements of
    /// other children that arrive first are kept for later calls.
    ///
    /// # Errors
    /// `CANCELLED` when the runtime's event bus is gone (the runtime was dropped).
    ///
    /// # Cancel safety
    /// Cancel safe: a settlement received before the future was dropped is kept.
    pub async fn next_of(&mut self, child: SessionId) -> Result<SubagentRunEndInfo> {
        if let Some(at) = self.kept.iter().position(|end| end.info.id == child) {
            if let Some(end) = self.kept.remove(at) {
                return Ok(end);
            }
        }
        loop {
            let end = self.receive().await?;
            if end.info.id == child {
                return Ok(end);
            }
            self.kept.push_back(end);
        }
    }

    async fn receive(&mut self) -> Result<SubagentRunEndInfo> {
        self.ended.recv().await.ok_or_else(|| {
            SubagentError::new(
                ErrorCode::Cancelled,
                "the runtime is gone: no child of this parent will settle any more",
            )
        })
    }
}
