//! Provides the history book of one schedule: every lifecycle and inbox event the runtime
//! emitted and every answer the driver got, in one sequence (the runtime runs on one thread,
//! so listeners and answers are totally ordered), plus what the driver learned of the forest.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::Serialize;

use crate::error::ErrorCode;
use crate::events::{EventScope, Subscription};
use crate::host::{AgentEvent, AgentEventKind};
use crate::ids::{MessageId, SessionId};
use crate::runtime::Runtime;
use crate::seam::SubagentEvent;
use crate::session::InboxTarget;

/// One thing that happened, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// An epoch began (`subagent/start`) under `parent`.
    Start { child: SessionId, parent: SessionId },
    /// An epoch ended (`subagent/end`).
    End { child: SessionId },
    /// An agent's inbox accepted a message.
    Inserted {
        agent: SessionId,
        message: MessageId,
        target: InboxTarget,
    },
    /// A turn claimed a message.
    Claimed {
        agent: SessionId,
        message: MessageId,
    },
    /// A cancel discarded a pending message.
    Discarded {
        agent: SessionId,
        message: MessageId,
    },
    /// A durable write of the agent's session failed.
    Faulted { agent: SessionId, code: ErrorCode },
}

/// A child the schedule started (its start was answered `Ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Child {
    pub(crate) id: SessionId,
    pub(crate) parent: SessionId,
    /// 1 below a root.
    pub(crate) depth: u8,
}

/// A message the runtime answered as accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Accepted {
    pub(crate) child: SessionId,
    /// Sent alone, after the previous send to the child was answered: its place in the child's
    /// FIFO is its place in the call order.
    pub(crate) sequential: bool,
}

/// A broken promise the checker found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// Which property: `exactly-once`, `fifo`, `one-activation`, `epochs`, `notices`, `ghost`,
    /// `listing`, `durable-answer`, `live-after-drain`, `live-after-shutdown`, `left-behind`, `hang`,
    /// `authority`, `resume-race`, `fenced`, `unexpected-error`.
    pub property: &'static str,
    /// What was seen.
    pub detail: String,
}

/// The book.
#[derive(Debug, Default)]
pub(crate) struct Book {
    pub(crate) entries: Vec<Entry>,
    pub(crate) children: Vec<Child>,
    /// Messages answered as accepted, by id.
    pub(crate) accepted: BTreeMap<MessageId, Accepted>,
    /// Per child, its sequential accepted messages in call order.
    pub(crate) sequential: BTreeMap<SessionId, Vec<MessageId>>,
    /// Per parent, how many starts under it have an unknown outcome (their futures were
    /// dropped): each may have made a child the checker cannot name.
    pub(crate) unknown_starts: BTreeMap<SessionId, usize>,
    /// The one-shot children whose start was answered.
    pub(crate) one_shots: BTreeSet<SessionId>,
    /// Sessions some store fault may have cut short (a write that failed or never ran).
    pub(crate) faulted: BTreeSet<SessionId>,
    /// Whether a store fault was ever armed: errors that only faults explain are excused.
    pub(crate) faults_seen: bool,
    pub(crate) anomalies: Vec<Anomaly>,
}

impl Book {
    pub(crate) fn anomaly(&mut self, property: &'static str, detail: impl Into<String>) {
        self.anomalies.push(Anomaly {
            property,
            detail: detail.into(),
        });
    }

    fn record_agent(&mut self, event: &AgentEvent) {
        let agent = event.agent;
        let entry = match &event.kind {
            AgentEventKind::InboxInserted { message, target } => Entry::Inserted {
                agent,
                message: *message,
                target: *target,
            },
            AgentEventKind::InboxClaimed { message, .. } => Entry::Claimed {
                agent,
                message: *message,
            },
            AgentEventKind::InboxDiscarded { message } => Entry::Discarded {
                agent,
                message: *message,
            },
            AgentEventKind::Faulted { error } => {
                self.faulted.insert(agent);
                Entry::Faulted {
                    agent,
                    code: error.code(),
                }
            }
            _ => return,
        };
        self.entries.push(entry);
    }

    fn record_lifecycle(&mut self, event: &SubagentEvent) {
        match event {
            SubagentEvent::Start(start) => self.entries.push(Entry::Start {
                child: start.id,
                parent: start.parent,
            }),
            SubagentEvent::End(end) => self.entries.push(Entry::End { child: end.info.id }),
            _ => {}
        }
    }

    /// Records an accepted message.
    pub(crate) fn accept(&mut self, message: MessageId, child: SessionId, sequential: bool) {
        self.accepted
            .insert(message, Accepted { child, sequential });
        if sequential {
            self.sequential.entry(child).or_default().push(message);
        }
    }
}

/// The book, shared by the driver, its background operations and the runtime's listeners.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedBook(Arc<Mutex<Book>>);

impl SharedBook {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Book> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Subscribes the book to `rt`'s agent and lifecycle events (kept while the subscriptions
    /// live).
    pub(crate) fn listen(&self, rt: &Runtime) -> [Subscription; 2] {
        let agents = self.clone();
        let lifecycle = self.clone();
        [
            rt.events()
                .subscribe(EventScope::All, move |event: &AgentEvent| {
                    agents.lock().record_agent(event);
                }),
            rt.subagents()
                .events()
                .subscribe(EventScope::All, move |event: &SubagentEvent| {
                    lifecycle.lock().record_lifecycle(event);
                }),
        ]
    }
}
