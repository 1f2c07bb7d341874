//! The error surface: codes print as the TypeScript runtime's strings, and errors carry their code.

use subagents::{ErrorCode, SubagentError};

#[test]
fn every_code_prints_its_stable_string() {
    let pinned = [
        (ErrorCode::NoProvider, "NO_PROVIDER"),
        (ErrorCode::DuplicateProvider, "DUPLICATE_PROVIDER"),
        (ErrorCode::UnsupportedCapability, "UNSUPPORTED_CAPABILITY"),
        (
            ErrorCode::ContinuationUnavailable,
            "CONTINUATION_UNAVAILABLE",
        ),
        (ErrorCode::PersistenceUnavailable, "PERSISTENCE_UNAVAILABLE"),
        (ErrorCode::DuplicateChild, "DUPLICATE_CHILD"),
        (ErrorCode::NotResumable, "NOT_RESUMABLE"),
        (ErrorCode::Unauthorized, "UNAUTHORIZED"),
        (ErrorCode::Draining, "DRAINING"),
        (ErrorCode::ActivationClosing, "ACTIVATION_CLOSING"),
        (ErrorCode::ParentUnavailable, "PARENT_UNAVAILABLE"),
        (
            ErrorCode::ActivationTeardownFailed,
            "ACTIVATION_TEARDOWN_FAILED",
        ),
        (
            ErrorCode::ActivationSetupRevoked,
            "ACTIVATION_SETUP_REVOKED",
        ),
        (
            ErrorCode::ActivationSetupReleaseFailed,
            "ACTIVATION_SETUP_RELEASE_FAILED",
        ),
        (
            ErrorCode::SubagentControlProjectionsUnavailable,
            "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE",
        ),
        (
            ErrorCode::SubagentControlSessionStoreUnavailable,
            "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE",
        ),
        (ErrorCode::Cancelled, "CANCELLED"),
        (ErrorCode::UnsupportedSchema, "UNSUPPORTED_SCHEMA"),
        (ErrorCode::InvalidArgs, "INVALID_ARGS"),
        (ErrorCode::UnknownTool, "UNKNOWN_TOOL"),
        (ErrorCode::InvalidMaxDepth, "INVALID_MAX_DEPTH"),
        (ErrorCode::InvalidSubagentDepth, "INVALID_SUBAGENT_DEPTH"),
        (ErrorCode::DepthOverflow, "DEPTH_OVERFLOW"),
        (ErrorCode::DepthExceeded, "DEPTH_EXCEEDED"),
        (
            ErrorCode::AbortedBeforePublication,
            "ABORTED_BEFORE_PUBLICATION",
        ),
        (ErrorCode::InvalidDescriptor, "INVALID_DESCRIPTOR"),
        (ErrorCode::InvalidSeed, "INVALID_SEED"),
        (ErrorCode::InvalidHeader, "INVALID_HEADER"),
        (ErrorCode::InvalidEvent, "INVALID_EVENT"),
        (ErrorCode::SessionNotFound, "SESSION_NOT_FOUND"),
        (ErrorCode::SessionExists, "SESSION_EXISTS"),
        (ErrorCode::StoreConflict, "STORE_CONFLICT"),
        (ErrorCode::StoreCorrupt, "STORE_CORRUPT"),
        (ErrorCode::StoreIo, "STORE_IO"),
        (ErrorCode::DuplicateAgent, "DUPLICATE_AGENT"),
        (ErrorCode::AgentDisposed, "AGENT_DISPOSED"),
        (ErrorCode::DuplicateTool, "DUPLICATE_TOOL"),
        (ErrorCode::InvalidRestriction, "INVALID_RESTRICTION"),
        (ErrorCode::ModelUnavailable, "MODEL_UNAVAILABLE"),
        (ErrorCode::UnknownPromptVariable, "UNKNOWN_PROMPT_VARIABLE"),
        (ErrorCode::ListenerRejected, "LISTENER_REJECTED"),
        (ErrorCode::NoActorSystem, "NO_ACTOR_SYSTEM"),
        (ErrorCode::ReportableBug, "REPORTABLE_BUG"),
        (ErrorCode::SessionLeased, "SESSION_LEASED"),
        (ErrorCode::LeaseLost, "LEASE_LOST"),
        (ErrorCode::AgentFaulted, "AGENT_FAULTED"),
        (ErrorCode::BudgetExhausted, "BUDGET_EXHAUSTED"),
        (ErrorCode::InvalidBudget, "INVALID_BUDGET"),
        (ErrorCode::InvalidProjection, "INVALID_PROJECTION"),
        (ErrorCode::JobsUnavailable, "JOBS_UNAVAILABLE"),
        (ErrorCode::InvalidConfig, "INVALID_CONFIG"),
        (ErrorCode::ChildStartFailed, "CHILD_START_FAILED"),
        (ErrorCode::NodeUnresponsive, "NODE_UNRESPONSIVE"),
    ];
    for (code, text) in pinned {
        assert_eq!(code.as_str(), text);
        assert_eq!(code.to_string(), text);
        assert_eq!(
            serde_json::to_value(code).unwrap(),
            serde_json::json!(text),
            "serde form of {text}"
        );
        assert_eq!(
            serde_json::from_value::<ErrorCode>(serde_json::json!(text)).unwrap(),
            code
        );
    }
}

// SVC-15
#[test]
fn an_error_shows_its_code_and_keeps_its_cause() {
    let io = std::io::Error::other("disk on fire");
    let error = SubagentError::new(ErrorCode::StoreIo, "writing").with_source(io);
    assert_eq!(error.code(), ErrorCode::StoreIo);
    assert_eq!(error.to_string(), "STORE_IO: writing");
    let cause = std::error::Error::source(&error).expect("the cause is kept");
    assert_eq!(cause.to_string(), "disk on fire");
    let clone = error.clone();
    assert_eq!(clone.message(), "writing");
}

#[test]
fn building_a_runtime_outside_an_actor_system_is_a_typed_error() {
    let error = subagents::Runtime::builder().build().unwrap_err();
    assert_eq!(error.code(), ErrorCode::NoActorSystem);
}

#[test]
fn public_handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<subagents::AgentRef>();
    assert_send_sync::<subagents::AgentHandle>();
    assert_send_sync::<subagents::Agents>();
    assert_send_sync::<subagents::Runtime>();
    assert_send_sync::<subagents::SessionLog>();
    assert_send_sync::<subagents::SessionId>();
    assert_send_sync::<subagents::MessageId>();
    assert_send_sync::<subagents::RunId>();
    assert_send_sync::<SubagentError>();
    assert_send_sync::<subagents::testing::ScriptedModel>();
    assert_send_sync::<subagents::Subagents>();
    assert_send_sync::<subagents::SubagentRun>();
    assert_send_sync::<subagents::SubagentStartRequest>();
    assert_send_sync::<subagents::SpawnInProcess>();
    assert_send_sync::<subagents::ForkInProcess>();
    assert_send_sync::<subagents::ProviderRegistration>();
    assert_send_sync::<subagents::model::OpenAiAdapter>();
}
