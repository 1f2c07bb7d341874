//! Provides [`SubagentError`], the one error type of the crate, and its stable [`ErrorCode`].
//!
//! Callers branch on [`SubagentError::code`], never on the message. Every code prints as the
//! delegation API's string, as the TypeScript runtime spells it (`NO_PROVIDER`, `UNAUTHORIZED`,
//! ...) and the strings are pinned by a test: a code may be deprecated, never renamed or removed.
//!
//! Expected outcomes are values, not errors: a child that failed is a result with a stop reason,
//! and a model failure inside a turn is recorded as `turn/end {error}`. An `Err` means the runtime
//! could not do what it was asked.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The crate's result alias.
pub type Result<T, E = SubagentError> = std::result::Result<T, E>;

/// A stable, machine-readable error code.
///
/// The first group mirrors the delegation API's error table one for one; the second group names
/// the host-runtime failures (storage, sessions, agents, tools) that the table leaves to
/// the host.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// No provider is registered under the requested name.
    NoProvider,
    /// A provider with that name is already registered.
    DuplicateProvider,
    /// The request uses a capability the provider does not advertise.
    UnsupportedCapability,
    /// No continuation manager is mounted.
    ContinuationUnavailable,
    /// No session-persistence backend is configured.
    PersistenceUnavailable,
    /// A caller-reserved child id is already live or persisted (a non-seed extension).
    DuplicateChild,
    /// A persisted child cannot be resumed.
    NotResumable,
    /// The caller is not the exact live party the operation requires.
    Unauthorized,
    /// Admission is closed by a drain.
    Draining,
    /// The relevant Activation already opened its disposal transaction.
    ActivationClosing,
    /// The durable direct parent is not live, or refused the delivery.
    ParentUnavailable,
    /// One or more teardown boundaries failed.
    ActivationTeardownFailed,
    /// A setup contribution was revoked while the child was being built.
    ActivationSetupRevoked,
    /// One or more setup disposers failed.
    ActivationSetupReleaseFailed,
    /// The projection registry is not mounted.
    SubagentControlProjectionsUnavailable,
    /// The session store is not mounted.
    SubagentControlSessionStoreUnavailable,
    /// The caller's cancellation token fired before the operation was accepted.
    Cancelled,
    /// An output schema lies outside the enforced JSON Schema subset.
    UnsupportedSchema,
    /// Tool arguments failed the tool's schema.
    InvalidArgs,
    /// A tool name is unknown or hidden from the calling agent.
    UnknownTool,
    /// `max_depth` is not a non-negative safe integer.
    InvalidMaxDepth,
    /// An agent's `subagent_depth` is not a non-negative safe integer.
    InvalidSubagentDepth,
    /// The child depth exceeds the safe-integer range.
    DepthOverflow,
    /// The computed child depth exceeds `max_depth`.
    DepthExceeded,
    /// The request was cancelled before the child was published.
    AbortedBeforePublication,
    /// A descriptor is not losslessly JSON-serializable or is malformed.
    InvalidDescriptor,

    /// A seed is not a contiguous, lossless, balanced prefix.
    InvalidSeed,
    /// A session header fails validation.
    InvalidHeader,
    /// An event breaks the session log's envelope or turn/step invariants.
    InvalidEvent,
    /// No session with that id exists in the store.
    SessionNotFound,
    /// A session with that id already exists in the store.
    SessionExists,
    /// Another writer appended first, or a stale lease epoch tried to write.
    StoreConflict,
    /// A stored record cannot be decoded.
    StoreCorrupt,
    /// The storage backend failed, or did not answer within its deadline (a write's outcome
    /// is then unknown: it may have committed unseen).
    StoreIo,
    /// An agent with that session id is already live.
    DuplicateAgent,
    /// The agent was disposed or replaced; the reference is stale.
    AgentDisposed,
    /// A tool with that name is already registered in the same layer.
    DuplicateTool,
    /// A tool restriction is empty, global, or names a scope-local tool.
    InvalidRestriction,
    /// A model adapter failed outside a turn (for example, while listing routes).
    ModelUnavailable,
    /// A prompt template names a variable that is not registered.
    UnknownPromptVariable,
    /// A listener refused an event that must not be contained (`subagent/provider-added`).
    ListenerRejected,
    /// The runtime was built outside a running actix system.
    NoActorSystem,
    /// An internal invariant broke: a bug in this crate, please report it.
    ReportableBug,
    /// The session's lease is held by another runtime: the session is live there.
    SessionLeased,
    /// This writer's lease is no longer current (it expired and another runtime took it); its
    /// append was refused.
    LeaseLost,
    /// A durable write of the agent's session failed: the agent refuses new work, and its
    /// `flush` and `dispose` return the write's error.
    AgentFaulted,
    /// A continuable child has spent a limit of its budget (turns, tokens or wall time): it
    /// takes no more work until a follow-up raises that limit.
    BudgetExhausted,
    /// A budget limit is zero: a child under it could never run.
    InvalidBudget,
    /// A projection unit's registration conflicts with the unit registered under its key.
    InvalidProjection,
    /// No job controller serves the agent: background work cannot start.
    JobsUnavailable,
    /// A provider's (or tool's) configuration is invalid: it is refused at load.
    InvalidConfig,
    /// An out-of-process child could not be started: the spawn, the handshake or the session
    /// creation failed. The child was reaped before the start failed.
    ChildStartFailed,
    /// Another node of the cluster did not answer a delivery within its deadline
    /// (`PostgresConfig::delivery_deadline`): one it never took is withdrawn and will not be
    /// served; one it took may have been served.
    NodeUnresponsive,
}

impl ErrorCode {
    /// The stable string form, as the TypeScript runtime spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoProvider => "NO_PROVIDER",
            Self::DuplicateProvider => "DUPLICATE_PROVIDER",
            Self::UnsupportedCapability => "UNSUPPORTED_CAPABILITY",
            Self::ContinuationUnavailable => "CONTINUATION_UNAVAILABLE",
            Self::PersistenceUnavailable => "PERSISTENCE_UNAVAILABLE",
            Self::DuplicateChild => "DUPLICATE_CHILD",
            Self::NotResumable => "NOT_RESUMABLE",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Draining => "DRAINING",
            Self::ActivationClosing => "ACTIVATION_CLOSING",
            Self::ParentUnavailable => "PARENT_UNAVAILABLE",
            Self::ActivationTeardownFailed => "ACTIVATION_TEARDOWN_FAILED",
            Self::ActivationSetupRevoked => "ACTIVATION_SETUP_REVOKED",
            Self::ActivationSetupReleaseFailed => "ACTIVATION_SETUP_RELEASE_FAILED",
            Self::SubagentControlProjectionsUnavailable => {
                "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
            }
            Self::SubagentControlSessionStoreUnavailable => {
                "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"
            }
            Self::Cancelled => "CANCELLED",
            Self::UnsupportedSchema => "UNSUPPORTED_SCHEMA",
            Self::InvalidArgs => "INVALID_ARGS",
            Self::UnknownTool => "UNKNOWN_TOOL",
            Self::InvalidMaxDepth => "INVALID_MAX_DEPTH",
            Self::InvalidSubagentDepth => "INVALID_SUBAGENT_DEPTH",
            Self::DepthOverflow => "DEPTH_OVERFLOW",
            Self::DepthExceeded => "DEPTH_EXCEEDED",
            Self::AbortedBeforePublication => "ABORTED_BEFORE_PUBLICATION",
            Self::InvalidDescriptor => "INVALID_DESCRIPTOR",
            Self::InvalidSeed => "INVALID_SEED",
            Self::InvalidHeader => "INVALID_HEADER",
            Self::InvalidEvent => "INVALID_EVENT",
            Self::SessionNotFound => "SESSION_NOT_FOUND",
            Self::SessionExists => "SESSION_EXISTS",
            Self::StoreConflict => "STORE_CONFLICT",
            Self::StoreCorrupt => "STORE_CORRUPT",
            Self::StoreIo => "STORE_IO",
            Self::DuplicateAgent => "DUPLICATE_AGENT",
            Self::AgentDisposed => "AGENT_DISPOSED",
            Self::DuplicateTool => "DUPLICATE_TOOL",
            Self::InvalidRestriction => "INVALID_RESTRICTION",
            Self::ModelUnavailable => "MODEL_UNAVAILABLE",
            Self::UnknownPromptVariable => "UNKNOWN_PROMPT_VARIABLE",
            Self::ListenerRejected => "LISTENER_REJECTED",
            Self::NoActorSystem => "NO_ACTOR_SYSTEM",
            Self::ReportableBug => "REPORTABLE_BUG",
            Self::SessionLeased => "SESSION_LEASED",
            Self::LeaseLost => "LEASE_LOST",
            Self::AgentFaulted => "AGENT_FAULTED",
            Self::BudgetExhausted => "BUDGET_EXHAUSTED",
            Self::InvalidBudget => "INVALID_BUDGET",
            Self::InvalidProjection => "INVALID_PROJECTION",
            Self::JobsUnavailable => "JOBS_UNAVAILABLE",
            Self::InvalidConfig => "INVALID_CONFIG",
            Self::ChildStartFailed => "CHILD_START_FAILED",
            Self::NodeUnresponsive => "NODE_UNRESPONSIVE",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one error type of the crate: a stable [`ErrorCode`], a human message, and an optional
/// cause. Cheap to clone, so a memoized operation (such as an idempotent dispose) can hand the
/// same failure to every caller.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct SubagentError {
    code: ErrorCode,
    message: String,
    #[source]
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
}

impl SubagentError {
    /// Builds an error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying cause.
    #[must_use]
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The underlying cause itself (`Error::source` sees through the shared pointer to the
    /// cause's own source, one link too far for a downcast).
    pub(crate) fn cause(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn StdError + 'static))
    }

    /// The stable code; branch on this, never on the message.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The human-readable message (without the code prefix).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// A storage-backend failure.
    pub(crate) fn store_io(
        what: impl fmt::Display,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        // The cause stays the source, not part of the message, so a chain printer shows it once.
        Self::new(ErrorCode::StoreIo, what.to_string()).with_source(source)
    }

    /// The same failure, its message prefixed with what the caller was doing (`"{what}: …"`);
    /// the code and the cause stay.
    #[must_use]
    pub(crate) fn about(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    pub(crate) fn bug(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ReportableBug, message)
    }

    /// The agent behind a reference is gone.
    pub(crate) fn agent_gone(id: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::AgentDisposed,
            format!("agent {id} was disposed or replaced"),
        )
    }
}

/// Errors compare by code and message; the cause is context, not identity.
impl PartialEq for SubagentError {
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl From<actix::MailboxError> for SubagentError {
    fn from(error: actix::MailboxError) -> Self {
        Self::new(
            ErrorCode::AgentDisposed,
            format!("actor unavailable: {error}"),
        )
    }
}
