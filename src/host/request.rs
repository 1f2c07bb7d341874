//! Provides [`CreateAgent`] and [`ResumeAgent`]: what the agents service is asked to create or
//! resume, built step by step and checked by the creation transaction.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use crate::actors::agent::AgentRef;
use crate::host::{AgentOptions, AgentSetup};
use crate::ids::SessionId;
use crate::session::log::CreationCommit;
use crate::session::{Seed, SessionOrigin};
use crate::store::StoredSession;

/// What to create: the session's identity and lineage, its seed, options and setup.
#[derive(Default)]
pub struct CreateAgent {
    pub(crate) id: Option<SessionId>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) parent_session: Option<SessionId>,
    pub(crate) origin: Option<SessionOrigin>,
    pub(crate) delegation_depth: Option<u64>,
    pub(crate) seed: Seed,
    pub(crate) seed_length: Option<u64>,
    pub(crate) options: AgentOptions,
    pub(crate) setup: Option<Box<dyn AgentSetup>>,
    pub(crate) cancel: Option<CancellationToken>,
    pub(crate) owner: Option<AgentRef>,
    /// Start the agent on the calling arbiter instead of the next worker: set by a creation
    /// that already runs on the worker it chose, so the child, its write-behind and whatever
    /// drives it share one thread.
    pub(crate) on_current_arbiter: bool,
    /// A short-lived agent (a one-shot child): its writer waits for work as a task instead of
    /// parking in the log between writes, since parking only pays for an agent that idles.
    pub(crate) short_lived: bool,
    /// Defers storing the session until its creation commits (see [`CreationCommit`]): a
    /// delegated child whose creation is refused or rolled back, or cut short by a crash,
    /// leaves nothing in the store. For a freshly minted id only: a stored id is found taken
    /// (`SESSION_EXISTS`) when the creation commits, not when it is published.
    pub(crate) deferred: Option<CreationCommit>,
    /// The new agent's ancestors, nearest first, when its creator knows more of them than the
    /// owner or the header tell (see [`AgentRef::ancestors`]).
    pub(crate) ancestors: Option<Box<[SessionId]>>,
}

impl CreateAgent {
    /// A fresh root agent with default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this session id instead of a fresh one.
    #[must_use]
    pub fn id(mut self, id: SessionId) -> Self {
        self.id = Some(id);
        self
    }

    /// The working directory (absolute).
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Marks the session as delegated by `parent` at `depth`.
    #[must_use]
    pub fn delegated_by(mut self, parent: SessionId, depth: u64) -> Self {
        self.parent_session = Some(parent);
        self.origin = Some(SessionOrigin::Subagent);
        self.delegation_depth = Some(depth);
        self
    }

    /// Makes the new agent a child owned by `owner` (exactly this incarnation): the creation is
    /// refused with `AGENT_DISPOSED` unless `owner` is live and not being disposed, both when the
    /// id is reserved and when the agent is published, and disposing `owner` disposes the child
    /// first. The header names `owner` as parent at `depth` (see [`CreateAgent::delegated_by`]).
    #[must_use]
    pub fn owned_by(mut self, owner: &AgentRef, depth: u64) -> Self {
        self.owner = Some(owner.clone());
        self.delegated_by(owner.id(), depth)
    }

    /// Seeds the log; `inherited` is how many of the events count as inherited lineage
    /// (`seedLength`; a seed stored by reference must count all of them). A non-empty seed gets
    /// a `session/end-seed` marker. Takes events (checked and stored inline) or a fork's
    /// [`Seed`] (shared with its parent and stored by reference).
    #[must_use]
    pub fn seed(mut self, seed: impl Into<Seed>, inherited: u64) -> Self {
        self.seed = seed.into();
        self.seed_length = (inherited > 0).then_some(inherited);
        self
    }

    /// The agent's model options.
    #[must_use]
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// The setup step (see [`AgentSetup`]).
    #[must_use]
    pub fn setup(mut self, setup: impl AgentSetup) -> Self {
        self.setup = Some(Box::new(setup));
        self
    }

    /// The creation-abort token: if it fires before publication, nothing is published.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Starts the agent on the calling arbiter (see [`CreateAgent::on_current_arbiter`]).
    #[must_use]
    pub(crate) fn on_current_arbiter(mut self) -> Self {
        self.on_current_arbiter = true;
        self
    }

    /// Marks the agent short-lived (see [`CreateAgent::short_lived`]).
    #[must_use]
    pub(crate) fn short_lived(mut self) -> Self {
        self.short_lived = true;
        self
    }

    /// Stores the session only once its creation commits (see [`CreateAgent::deferred`]).
    #[must_use]
    pub(crate) fn stored_on(mut self, commit: CreationCommit) -> Self {
        self.deferred = Some(commit);
        self
    }

    /// Records the new agent's ancestors (see [`CreateAgent::ancestors`]).
    #[must_use]
    pub(crate) fn below(mut self, ancestors: &[SessionId]) -> Self {
        self.ancestors = Some(ancestors.into());
        self
    }
}

/// What to resume: a stored session, its options and setup.
pub struct ResumeAgent {
    pub(crate) id: SessionId,
    pub(crate) options: AgentOptions,
    pub(crate) setup: Option<Box<dyn AgentSetup>>,
    pub(crate) cancel: Option<CancellationToken>,
    /// The session as its caller inspected it before the resume (read again only past it).
    pub(crate) inspected: Option<StoredSession>,
    /// The agent's ancestors, nearest first, when its caller knows more of them than the
    /// header tells (see [`AgentRef::ancestors`]).
    pub(crate) ancestors: Option<Box<[SessionId]>>,
}

impl ResumeAgent {
    /// Resumes session `id` with default options.
    pub fn new(id: SessionId) -> Self {
        Self {
            id,
            options: AgentOptions::default(),
            setup: None,
            cancel: None,
            inspected: None,
            ancestors: None,
        }
    }

    /// Loads the session from `inspected` (what [`SessionPersistence::inspect`] returned for
    /// it), reading only what was stored after it.
    ///
    /// [`SessionPersistence::inspect`]: crate::store::SessionPersistence::inspect
    #[must_use]
    pub(crate) fn inspected(mut self, inspected: StoredSession) -> Self {
        self.inspected = Some(inspected);
        self
    }

    /// Records the agent's ancestors (see [`ResumeAgent::ancestors`]).
    #[must_use]
    pub(crate) fn below(mut self, ancestors: &[SessionId]) -> Self {
        self.ancestors = Some(ancestors.into());
        self
    }

    /// The agent's model options.
    #[must_use]
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// The setup step.
    #[must_use]
    pub fn setup(mut self, setup: impl AgentSetup) -> Self {
        self.setup = Some(Box::new(setup));
        self
    }

    /// The creation-abort token.
    #[must_use]
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }
}
