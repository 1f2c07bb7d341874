//! Provides the test doubles a host or an integration harness needs, in one place: a
//! deterministic [`ScriptedModel`] (text, tool calls, failures, hangs, and [`Gate`]s that hold a
//! response until released), a [`ScriptedProvider`] for the delegation API, and a
//! [`FaultInjectingStore`] that fails or holds chosen store operations.
//!
//! They are ordinary public types: the load harness drives the scripted model too. A checker
//! reading a log afterwards has [`message_fates`]: what became of each inbox message.

pub use crate::host::inbox::{message_fates, MessageFate};
pub use crate::model::scripted::{Gate, Responder, ScriptStep, ScriptedModel};
pub use crate::seam::scripted::ScriptedProvider;
pub use crate::store::faults::{FaultInjectingStore, StoreOperation};

/// How many continuable children are resident in `subagents` now. A test and benchmark probe:
/// the delegation API itself exposes no residency query (as in the TypeScript runtime).
pub async fn resident_count(subagents: &crate::Subagents) -> usize {
    subagents.resident_count().await
}

/// How many host-owned parents (parents that are not themselves continuable children) have an
/// ownership node in `subagents` now: one for each such parent with a resident continuable
/// child or a release in flight. A test probe, as [`resident_count`] is.
pub async fn owner_node_count(subagents: &crate::Subagents) -> usize {
    subagents.owner_node_count().await
}

/// Cancels `agent`'s turn and applies `inbox` to its pending work as the runtime itself does
/// (a drain, a child's own hook), reaching a resident continuable child, whose inbox refuses a
/// host's [`crate::AgentRef::cancel`]. For white-box tests of the continuation manager's
/// windows (a child cancelled from inside its own admission window); a host interrupts a
/// continuable child through [`crate::Subagents::interrupt`].
pub fn cancel_as_runtime(
    agent: &crate::AgentRef,
    cause: crate::CancelCause,
    inbox: crate::InboxPolicy,
) {
    agent.cancel_now(cause, inbox);
}

/// Posts `message` to `agent` as the runtime posts one it may have delivered before (a settled
/// notice or a report asked again under its id): a message the agent accepted earlier is
/// answered with that acceptance and not inserted again. A white-box test probe, as
/// [`cancel_as_runtime`] is.
///
/// # Errors
/// As the first delivery's: `AGENT_DISPOSED`, or the store's, reading back a log the agent
/// paged out.
pub async fn post_again(
    agent: &crate::AgentRef,
    message: crate::Message,
) -> crate::Result<crate::ids::MessageId> {
    agent
        .post(
            message,
            crate::actors::agent::PostTarget::TurnOrStep,
            None,
            true,
            crate::trace::SentFrom::default(),
        )
        .await
}
